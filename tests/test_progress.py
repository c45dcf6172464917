"""``kvkit progress`` and ``kvkit hint``: the learner's view of the steps.

Checked on small made-up exercise directories for the parts that need no real
step (the current step, the hint sequence, --watch, usage errors), and on
copies of exercises/ for the real step 1's hint and a check that never
returns. What progress shows for a fresh copy (step 1 pending) and for one
filled with the reference (all done) is checked in test_steps.py, on the same
step runs that check each step.
"""
from __future__ import annotations

import ast
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from kvkit import cli, progress
from test_steps import fresh_copy

KIT = Path(__file__).resolve().parent.parent
EXERCISES = KIT / "exercises"
SOLUTIONS = KIT / "solutions"


def console() -> Console:
    return Console(file=io.StringIO(), width=400, soft_wrap=True, color_system=None)


def text_of(c: Console) -> str:
    return c.file.getvalue()


@pytest.fixture(autouse=True)
def no_impl_override(monkeypatch):
    monkeypatch.delenv("KVKIT_IMPL", raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # quicker step 7 runs (see test_steps.py)


def write_fake(folder: Path, second_passes: bool = False) -> Path:
    """An exercises directory with two quick steps: step 1 passes, step 2 fails in plain words (or passes)."""
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test_one.py").write_text("def test_fine():\n    pass\n")
    body = "    pass\n" if second_passes else (
        "    pytest.fail('step 2: query 2 saw keys 0..2 but should see keys 0..6 (chunk_local_mask)', pytrace=False)\n")
    (folder / "tests" / "test_two.py").write_text("import pytest\n\n\ndef test_fine():\n    pass\n\n\n"
                                                  "def test_mask():\n" + body)
    (folder / "steps.toml").write_text('''
[[step]]
number = 1
title = "One"
goal = "The first goal."
fills = "one.py"
tests = ["tests/test_one.py"]
hints = ["first of one"]

[[step]]
number = 2
title = "Two"
goal = "The second goal, in one sentence."
fills = "two.py"
tests = ["tests/test_two.py"]
hints = ["first of two", "second of two", "third of two"]
''')
    return folder


def test_the_current_step_is_the_first_pending_one(tmp_path):
    folder = write_fake(tmp_path / "ex")
    c = console()
    assert progress.progress_main(["--dir", str(folder)], console=c) == 1
    out = text_of(c)
    assert "step 1  One" in out and "done" in out.split("step 1  One")[1].splitlines()[0]
    assert "<- you are here" in out.split("step 2  Two")[1].splitlines()[0]
    assert "Step 2: Two" in out and "Goal: The second goal, in one sentence." in out
    assert "First failing check: test_two.py::test_mask" in out
    assert "step 2: query 2 saw keys 0..2 but should see keys 0..6 (chunk_local_mask)" in out
    assert "(1 of 2 steps done)" in out
    # the commands it suggests act on the folder it was given, not on the default one
    flat = " ".join(out.split())
    assert f"kvkit progress --dir {folder} --watch" in flat and f"kvkit hint --dir {folder}" in flat, out


def test_hints_come_one_at_a_time(tmp_path):
    folder = write_fake(tmp_path / "ex")
    outs = []
    for _ in range(4):
        c = console()
        assert progress.hint_main(["--dir", str(folder)], console=c) == 0
        outs.append(text_of(c))
    assert "Step 2: Two" in outs[0] and "Hint 1 of 3: first of two" in outs[0] and "second of two" not in outs[0]
    assert "Hint 2 of 3: second of two" in outs[1] and "first of two" not in outs[1]
    assert "Hint 3 of 3: third of two" in outs[2]
    assert "last hint" in outs[3] and all(h in outs[3] for h in ("first of two", "second of two", "third of two"))
    c = console()
    assert progress.hint_main(["--dir", str(folder), "--step", "1"], console=c) == 0
    assert "Hint 1 of 1: first of one" in text_of(c)
    assert progress.hint_main(["--dir", str(folder), "--reset"], console=console()) == 0
    c = console()
    progress.hint_main(["--dir", str(folder)], console=c)
    assert "Hint 1 of 3" in text_of(c)
    c = console()
    assert progress.hint_main(["--dir", str(folder), "--step", "9"], console=c) == 2


def test_hint_for_the_real_step_1(tmp_path):
    folder = fresh_copy(tmp_path / "exercises")
    c = console()
    assert progress.hint_main(["--dir", str(folder)], console=c) == 0
    first = progress.load_steps(folder)[0].hints[0]
    assert "Step 1:" in text_of(c) and f"Hint 1 of" in text_of(c) and first in text_of(c)


def test_all_done_exits_0(tmp_path):
    folder = write_fake(tmp_path / "ex", second_passes=True)
    c = console()
    assert progress.progress_main(["--dir", str(folder)], console=c) == 0
    assert "All 2 steps done." in text_of(c)
    c = console()
    assert progress.hint_main(["--dir", str(folder)], console=c) == 0
    assert "no hint needed" in text_of(c)


def test_watch_reruns_when_a_file_is_saved(tmp_path):
    folder = write_fake(tmp_path / "ex")
    c = console()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", progress.progress_main(
        ["--dir", str(folder), "--watch", "--max-runs", "2", "--interval", "0.05"], console=c)))
    thread.start()
    deadline = time.monotonic() + 60
    while "watching for changes" not in text_of(c) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "watching for changes" in text_of(c)
    (folder / "tests" / "test_two.py").write_text("def test_mask():\n    pass\n")
    later = time.time() + 5
    os.utime(folder / "tests" / "test_two.py", (later, later))
    thread.join(timeout=60)
    assert not thread.is_alive()
    out = text_of(c)
    assert out.count("your progress") == 2
    assert result["code"] == 0 and "All 2 steps done." in out


def test_usage_errors_exit_2(tmp_path, monkeypatch):
    c = console()
    assert progress.progress_main(["--dir", str(tmp_path)], console=c) == 2
    assert "no steps.toml" in text_of(c)
    monkeypatch.chdir(tmp_path)
    c = console()
    if not (Path(progress.__file__).parent / "steps.toml").is_file():
        assert progress.progress_main([], console=c) == 2
        assert "pass --dir" in text_of(c)
    (tmp_path / "steps.toml").write_text('[[step]]\nnumber = 1\ntitle = "x"\ngoal = "y."\ntests = ["tests/nope.py"]\n')
    c = console()
    assert progress.progress_main(["--dir", str(tmp_path)], console=c) == 2
    assert "tests/nope.py" in text_of(c)


def test_kvkit_command_dispatches_progress_and_hint(tmp_path, capsys):
    folder = write_fake(tmp_path / "ex")
    assert cli.main(["progress", "--dir", str(folder)]) == 1
    assert "Step 2: Two" in capsys.readouterr().out
    assert cli.main(["hint", "--dir", str(folder)]) == 0
    assert "first of two" in capsys.readouterr().out


def test_default_directory_is_exercises_under_the_current_one(tmp_path, monkeypatch):
    write_fake(tmp_path / "exercises")
    monkeypatch.chdir(tmp_path)
    c = console()
    assert progress.progress_main([], console=c) == 1
    assert str(tmp_path / "exercises") in text_of(c)


def test_progress_py_stands_alone():
    """The bundle ships kvkit/progress.py as progress.py: it may import only the standard library and rich."""
    tree = ast.parse(Path(progress.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    outside = {n for n in names if n not in sys.stdlib_module_names} - {"rich", "__future__"}
    assert not outside, f"progress.py imports {outside}"


def test_progress_py_runs_as_a_script_without_the_kit(tmp_path):
    folder = write_fake(tmp_path / "ex")
    script = shutil.copy(progress.__file__, folder / "progress.py")
    env = {k: v for k, v in os.environ.items() if k != "KVKIT_IMPL"}
    proc = subprocess.run([sys.executable, "-S", script], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=120)
    # -S: no site-packages in this process, so no rich and no kit: plain text (the steps' own pytest
    # processes start normally).
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Step 2: Two" in proc.stdout and "(chunk_local_mask)" in proc.stdout
    assert "python progress.py hint" in proc.stdout
    proc = subprocess.run([sys.executable, script, "hint", "--step", "2"], cwd=folder, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "Hint 1 of 3: first of two" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- a check that never returns

def looping_copy(target: Path, loop: str) -> tuple[Path, int]:
    """A fresh copy of exercises/ holding the reference, whose gqa_attention first runs ``loop`` forever.

    Returns the folder and the line number of the loop's first line in kv_cache.py.
    """
    folder = fresh_copy(target)
    for name in ("kv_cache_torch.py", "cost.py"):
        shutil.copyfile(SOLUTIONS / name, folder / name)
    source = (SOLUTIONS / "kv_cache.py").read_text().rstrip("\n") + "\n\n\n_reference = gqa_attention\n\n\n"
    wrapper = "def gqa_attention(q, cache, n_new):\n" + loop + "    return _reference(q, cache, n_new)\n"
    (folder / "kv_cache.py").write_text(source + wrapper)
    return folder, source.count("\n") + 2


def test_an_endless_loop_is_named_with_its_function_and_line_in_bounded_time(tmp_path):
    folder, line = looping_copy(tmp_path / "exercises", "    i = 0\n    while i < 10:\n        i = i * 1\n")
    c = console()
    start = time.monotonic()
    code = progress.progress_main(["--dir", str(folder), "--timeout", "1"], console=c)
    elapsed = time.monotonic() - start
    out = text_of(c)
    assert code == 1
    assert elapsed < 60, f"took {elapsed:.0f} s"  # about 6 s here: step 1, then step 2's first check, 1 s, and step 6
    assert "running step 1: A cache allocated once" in out and "running step 2: GQA heads" in out, out
    assert out.index("running step 2") < out.index("your progress")
    assert "<- you are here" in next(row for row in out.splitlines() if "step 2  " in row)
    failure = re.search(r"step 2: gqa_attention did not return within 1 s on (.+) \(kv_cache\.py line (\d+)", out)
    assert failure, out
    assert "B=1" in failure[1] and int(failure[2]) in (line + 1, line + 2), (failure[0], line)  # the loop
    assert "an endless loop?" in out and "--timeout" in out
    assert "got stuck first" in out  # the steps after it were not left running into the same loop
    rows = {n: next(row for row in out.splitlines() if f"step {n}  " in row) for n in range(1, 8)}
    for n in (3, 4, 7):  # they build on step 2: not started, or stopped
        assert "pending" in rows[n] and "waits for step 2" in rows[n], rows[n]
    for n in (1, 5, 6):  # the cost model and the port do not need the attention: they ran to the end
        assert "done" in rows[n], rows[n]


@pytest.mark.slow  # it spends a check's time and the backstop's grace spinning: make test-slow (CI runs it)
def test_a_loop_that_swallows_the_interruption_is_ended_and_named_by_the_standalone_script(tmp_path):
    """The backstop: faulthandler writes the stuck stack to a file, ends pytest, and progress.py reads it back."""
    # The work sits in an inner loop inside the try, so the interruption lands there (and is swallowed) rather
    # than on the outer loop's own lines, where it would end the loop like any other.
    loop = ("    while True:\n        try:\n            while True:\n                sum(range(100))\n"
            "        except BaseException:\n            pass\n")
    folder, line = looping_copy(tmp_path / "exercises", loop)
    script = shutil.copy(progress.__file__, folder / "progress.py")
    env = {k: v for k, v in os.environ.items() if k != "KVKIT_IMPL"}
    env["KVKIT_CHECK_TIMEOUT"] = "1"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-S", script], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=120)
    elapsed = time.monotonic() - start
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert elapsed < 60, f"took {elapsed:.0f} s"  # about 7 s: 1 s, the backstop's 3 s grace, pytest's start
    assert "running step 2: GQA heads" in out, out
    assert re.search(rf"step 2: gqa_attention did not return within 1 s on .+ \(kv_cache\.py line "
                     rf"({line}|{line + 1}|{line + 2}|{line + 3}|{line + 4})\b", out), out  # in the loop
    assert "did not stop when interrupted" in out


# --------------------------------------------------------------------------- at the speed of a save

def write_chain(folder: Path, tests: dict, needs: dict) -> Path:
    """An exercises directory with one step per entry of ``tests`` (``{number: test file body}``) and ``needs``."""
    (folder / "tests").mkdir(parents=True)
    toml = []
    for number, body in tests.items():
        (folder / "tests" / f"test_s{number}.py").write_text(body)
        toml.append(f'[[step]]\nnumber = {number}\ntitle = "Step number {number}"\ngoal = "Goal {number}."\n'
                    f'needs = {needs.get(number, [])}\ntests = ["tests/test_s{number}.py"]\n'
                    f'hints = ["hint {number}"]\n')
    (folder / "steps.toml").write_text("\n".join(toml))
    return folder


PASSES = "def test_fine():\n    pass\n"
FAILS = ("import pytest\n\n\ndef test_it():\n"
         "    pytest.fail('step {n}: the plain-words failure of step {n}', pytrace=False)\n")


def test_the_current_step_runs_first_alone_and_its_failure_is_shown_before_the_other_steps_run(tmp_path):
    folder = write_chain(tmp_path / "ex", {1: PASSES, 2: FAILS.format(n=2), 3: PASSES, 4: PASSES},
                         needs={2: [1], 3: [2]})
    c = console()
    assert progress.progress_main(["--dir", str(folder)], console=c) == 1  # no step remembered: step 1 first
    first = text_of(c)
    assert first.index("running step 1") < first.index("running step 2")
    assert "running step 3" not in first  # it builds on step 2, which failed
    assert "waits for step 2" in next(line for line in first.splitlines() if "step 3  " in line)
    assert "(step 3 builds on step 2: it runs once it passes)" in first
    assert "done" in next(line for line in first.splitlines() if "step 4  " in line)  # needs nothing: it ran
    c = console()
    assert progress.progress_main(["--dir", str(folder)], console=c) == 1
    out = text_of(c)
    lines = [line for line in out.splitlines() if line.strip()]
    # The remembered current step runs first, and its failure is printed before any other step starts.
    assert lines[0].startswith("running step 2"), out
    block = out.index("✘ Step 2: Step number 2")
    assert block < out.index("running step 1") and block < out.index("running step 4") < out.index("your progress")
    assert out.index("First failing check: test_s2.py::test_it") < out.index("running step 1")
    assert out.count("the plain-words failure of step 2") == 1  # not repeated under the board
    assert "Step 2: Step number 2   (2 of 4 steps done): its first failing check is above." in out
    assert "running step 3" not in out


def test_the_current_step_is_remembered_per_folder_and_for_the_hint(tmp_path):
    folder = write_chain(tmp_path / "ex", {1: PASSES, 2: PASSES, 3: FAILS.format(n=3)}, needs={2: [1], 3: [2]})
    assert progress.progress_main(["--dir", str(folder)], console=console()) == 1
    assert progress._remembered(folder) == 3
    c = console()
    assert progress.hint_main(["--dir", str(folder)], console=c) == 0
    out = text_of(c)
    assert "Hint 1 of 1: hint 3" in out and "running step 1" not in out and "running step 3" in out
    assert progress.hint_main(["--dir", str(folder), "--reset"], console=console()) == 0
    assert progress._remembered(folder) == 3  # --reset forgets the hints shown, not the current step
    (folder / "tests" / "test_s3.py").write_text(PASSES)
    assert progress.progress_main(["--dir", str(folder)], console=console()) == 0
    assert progress._remembered(folder) is None


def test_a_step_that_broke_again_becomes_the_current_one(tmp_path):
    """The steps before the remembered one run again after it: a change may have broken one."""
    folder = write_chain(tmp_path / "ex", {1: PASSES, 2: PASSES, 3: FAILS.format(n=3)}, needs={2: [1], 3: [2]})
    progress._remember(folder, 3)
    (folder / "tests" / "test_s1.py").write_text(FAILS.format(n=1))
    c = console()
    assert progress.progress_main(["--dir", str(folder)], console=c) == 1
    out = text_of(c)
    assert "<- you are here" in next(line for line in out.splitlines() if "step 1  " in line), out
    assert out.count("the plain-words failure of step 1") == 1  # printed once, under the board
    assert re.search(r"Step 1: Step number 1   \([01] of 3 steps done\)\n", out), out  # step 2 may be stopped
    assert out.index("✘ Step 3") < out.index("running step 1")  # the remembered step's failure came first
    assert "waits for step 1" in next(line for line in out.splitlines() if "step 3  " in line)
    assert progress._remembered(folder) == 1


def test_load_steps_refuses_a_need_that_does_not_come_before(tmp_path):
    folder = write_chain(tmp_path / "ex", {1: PASSES, 2: PASSES}, needs={1: [2]})
    with pytest.raises(progress.UsageError, match="needs step"):
        progress.load_steps(folder)


def test_the_kits_steps_need_what_they_build_on():
    steps = progress.load_steps(EXERCISES)
    needs = progress.all_needs(steps)
    assert needs[7] == {1, 2, 3, 4} and needs[4] == {1, 2, 3}
    assert needs[5] == set() and needs[6] == set()  # the cost model and the port do not need the attention


def test_ctrl_c_in_watch_exits_130_with_one_line(tmp_path):
    folder = write_chain(tmp_path / "ex", {1: PASSES, 2: FAILS.format(n=2)}, needs={2: [1]})
    script = shutil.copy(progress.__file__, folder / "progress.py")
    env = {k: v for k, v in os.environ.items() if k != "KVKIT_IMPL"}
    proc = subprocess.Popen([sys.executable, "-u", script, "--watch"], cwd=folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "watching for changes" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (seen, rest, err)
    assert rest.splitlines() == ["python progress.py: stopped (Ctrl-C)."] and err == "", (rest, err)


def test_ctrl_c_while_a_step_runs_exits_130_with_one_line_and_ends_its_processes(tmp_path):
    pid_file = tmp_path / "pid"
    slow = f"import os, time\n\n\ndef test_slow():\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n" \
           f"    time.sleep(60)\n"
    folder = write_chain(tmp_path / "ex", {1: slow}, needs={})
    env = {k: v for k, v in os.environ.items() if k != "KVKIT_IMPL"}
    proc = subprocess.Popen([sys.executable, "-u", "-m", "kvkit.cli", "progress", "--dir", str(folder), "--watch"],
                            cwd=KIT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists()
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - start < 10, (out, err)
    assert out.splitlines()[-1] == "kvkit progress: stopped (Ctrl-C)." and err == "", (out, err)
    assert [line for line in out.splitlines() if line.strip()][:-1] == [
        "running step 1: Step number 1 ..."], out  # nothing but that one line after the step's start
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's pytest ({pid}) still runs after Ctrl-C")


def test_watch_starts_again_when_a_file_is_saved_mid_run(tmp_path):
    flag = tmp_path / "fast"
    slow = (f"import os, time\n\n\ndef test_slow():\n    end = time.monotonic() + 60\n"
            f"    while not os.path.exists({str(flag)!r}) and time.monotonic() < end:\n        time.sleep(0.05)\n")
    folder = write_chain(tmp_path / "ex", {1: slow}, needs={})
    c = console()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", progress.progress_main(
        ["--dir", str(folder), "--watch", "--max-runs", "1", "--interval", "0.05"], console=c)))
    start = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 30
    while "running step 1" not in text_of(c) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    flag.write_text("")  # the rerun's test returns at once; the first run's would wait for this only
    later = time.time() + 5
    (folder / "tests" / "test_s1.py").write_text(slow + "\n")
    os.utime(folder / "tests" / "test_s1.py", (later, later))
    thread.join(timeout=60)
    assert not thread.is_alive() and result["code"] == 0
    out = text_of(c)
    assert "a file was saved: running again" in out and out.count("running step 1") == 2, out
    assert out.count("your progress") == 1 and time.monotonic() - start < 30


def test_every_planted_mistake_has_a_way_to_catch_it_shown_when_missed(tmp_path):
    from catalogue.mutants import PLANTED

    steps = progress.load_steps(EXERCISES)
    own = next(s for s in steps if s.number == 7)
    assert set(own.missed) == set(PLANTED), set(PLANTED) ^ set(own.missed)
    assert all(len(text) > 40 for text in own.missed.values())
    assert "is k_before" in own.missed["concat_growth"]
    import json

    matrix = {"your kv_cache.py": "pass", "chunk_local_mask": "fail", "concat_growth": "pass",
              "missing_scale": "fail"}
    results = [progress.Result(step, "done", passed=1) for step in steps]
    results[6].properties = {"kill_matrix": json.dumps(matrix)}
    c = console()
    progress.render(results, tmp_path, progress.Out(c), "kvkit progress")
    out = text_of(c)
    assert "Your own tests caught 2 of 3 planted mistakes; they miss: concat_growth." in out
    assert f"  concat_growth: {own.missed['concat_growth']}" in out
    assert "missing_scale:" not in out  # caught: no advice


def test_the_bench_times_the_first_failing_check_of_the_step_the_learner_is_on(tmp_path):
    """`kvkit bench --only progress` (benchmarks/progress_time.py): its learner on step 2 passes step 1, and the
    line it times is step 2's failure, printed before the run ends (no timing asserted: a shared machine)."""
    from benchmarks.progress_time import learner_copy, time_progress

    folder = learner_copy(tmp_path / "step2", 2)
    assert progress.run_step(progress.load_steps(folder)[0], folder).status == "done"
    run = time_progress(folder)
    assert run["step"] == 2 and run["exit_code"] == 1, run
    assert 0 < run["first_message_s"] < run["exit_s"], run
    assert progress._remembered(folder) == 2
