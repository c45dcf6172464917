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
    assert elapsed < 60, f"took {elapsed:.0f} s"  # about 4 s here: step 1, then step 2's first check, 1 s
    assert "running step 1: A cache allocated once" in out and "running step 2: GQA heads" in out, out
    assert out.index("running step 2") < out.index("your progress")
    assert "<- you are here" in next(row for row in out.splitlines() if "step 2  " in row)
    failure = re.search(r"step 2: gqa_attention did not return within 1 s on (.+) \(kv_cache\.py line (\d+)", out)
    assert failure, out
    assert "B=1" in failure[1] and int(failure[2]) in (line + 1, line + 2), (failure[0], line)  # the loop
    assert "an endless loop?" in out and "--timeout" in out
    assert "got stuck first" in out  # the steps after it were not left running into the same loop


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
