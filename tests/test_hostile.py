"""Hostile submissions (tests/hostile/): each gets a report that names what happened, no better
tier than its honest work earns, and the grader goes on to the next submission.

One batch grades every fixture (with a well-behaved submission after them) through the CLI,
at the best isolation this machine allows; a smaller batch repeats the cases that the audit
guard alone must stop at the process level, which is all a machine without namespaces gets.
Few random trials keep it fast: these tests are about containment, not verdict accuracy.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = os.path.join(ROOT, "tests", "hostile")
WELL_BEHAVED = os.path.join(ROOT, "catalogue", "examples", "hire_basic")
TIERS = ["Weak", "Hire", "Strong Hire"]
SENTINEL = "/tmp/kvkit-hostile-sentinel.txt"
ESCAPES = ["/tmp/kvkit-hostile-escape.txt", "/tmp/kvkit-hostile-escape-home.txt",
           os.path.join(ROOT, "solutions", "kvkit-hostile-escape.txt")]

# case -> (the best tier it may get, what its report must say)
EXPECT = {
    "infinite_loop": ("Weak", r"killed after \d+ s of wall time"),
    "memory_hog": ("Weak", r"MemoryError|out of memory"),
    "fork_bomb": ("Hire", r"starting processes: os\.fork"),
    "fork_bomb_ctypes": ("Weak", r"tampering suspected: runtime: ctypes\."),
    "exit_at_import": ("Weak", r"exited with status 0 before writing any result"),
    "sys_exit_at_import": ("Weak", r"failed to import: SystemExit: 3"),
    "exits_in_append": ("Weak", r"raised SystemExit"),
    "segfault_ctypes": ("Weak", r"segmentation fault \(SIGSEGV\)"),
    "output_flood": ("Hire", r"wrote 40\.0 MiB to stdout/stderr"),
    "read_solutions": ("Weak", r"solutions/kv_cache\.py"),
    "network": ("Hire", r"network access: socket\."),
    "write_outside": ("Hire", r"writing outside the working directory: /tmp/kvkit-hostile-escape\.txt"),
    "tamper_tracemalloc": ("Weak", r"tracemalloc\.get_traced_memory"),
    "tamper_builtins": ("Weak", r"builtins\.int"),
    "tamper_numpy": ("Hire", r"numpy\.array_equal replaced"),
    "tamper_harness": ("Weak", r"harness\._traced replaced"),
    "not_arrays": ("Weak", r"returned (NoneType|str|dict|object|_Weird)|raised RuntimeError: no array here"),
    "wrong_dtype": ("Weak", r"dtype (complex128|object|bool|<U)"),
    "wrong_shape": ("Weak", r"expected an array of shape"),
    "plant_links": ("Weak", r"too many files"),
    "forge_results": ("Weak", r"changing the sandbox's job folder: \S*\.kvkit/(results\.json|out\.npy)"),
    "guard_log_flood": ("Weak", r"runtime: ctypes\.dlopen"),
    "huge_array": ("Weak", r"returned ndarray of shape \[1048576, 1048576, 1024\]"),
}
# measured criteria a case tries to fake: they must not pass
FAKED = {"forge_results": ["no_kv_repeat"], "guard_log_flood": ["preallocated_in_place"],
         "tamper_tracemalloc": ["no_kv_repeat"], "tamper_builtins": ["no_kv_repeat"],
         "tamper_harness": ["no_kv_repeat"], "tamper_numpy": ["overflow_atomic"]}
PROCESS_LEVEL = ["read_solutions", "write_outside", "network", "fork_bomb", "tamper_harness"]


def grade_batch(paths: list[str], out: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVKIT_SANDBOX_MEMORY_MB": "1024"}  # the memory hog stops at 1 GiB
    return subprocess.run([sys.executable, "-m", "grader", *paths, "--out", out, "--quiet", "--jobs", "2",
                           "--timeout", "15", "--trials", "20", "--seed", "7", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def read_reports(out: str) -> dict:
    reports = {}
    for name in os.listdir(out):
        if name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                report = json.load(f)
            reports[report["submission"]] = report
    return reports


def leftover_processes() -> list[str]:
    """Processes still working in a grading directory that is gone (a child the grader failed to take back)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if "kvkit-sub-" in cwd and cwd.endswith("(deleted)"):
            found.append(f"{pid}: {cwd}")
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every hostile case, then a well-behaved submission, graded in one batch: ``(reports, stderr)``.

    Under pytest-xdist the batch runs once per session, whichever worker comes first; the others
    wait for it and read its reports.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, marker = shared / "hostile-batch", shared / "hostile-batch.done"
    with open(shared / "hostile-batch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            for path in ESCAPES:
                if os.path.exists(path):
                    os.remove(path)
            with open(SENTINEL, "w") as f:
                f.write("must survive the hostile batch\n")
            cases = sorted(EXPECT)
            done = grade_batch([os.path.join(HOSTILE, c) for c in cases] + [WELL_BEHAVED], str(out))
            assert done.returncode == 0, done.stderr[-3000:]
            marker.write_text(done.stderr)
    return read_reports(str(out)), marker.read_text()


def text_of(report: dict) -> str:
    return json.dumps(report)


def test_every_case_has_a_fixture():
    assert sorted(EXPECT) == sorted(d for d in os.listdir(HOSTILE) if os.path.isdir(os.path.join(HOSTILE, d)))


@pytest.mark.parametrize("case", sorted(EXPECT))
def test_hostile_case(graded, case):
    reports, _ = graded
    report = reports[case]
    best, says = EXPECT[case]
    assert report["schema"] == "kvkit.report/1"
    assert TIERS.index(report["tier"]) <= TIERS.index(best), (report["tier"], report.get("tier_reason"))
    assert re.search(says, text_of(report)), (report.get("error"), report.get("notes"))
    for cid in FAKED.get(case, []):
        status = {c["id"]: c["status"] for c in report["criteria"]}[cid]
        assert status != "pass", f"{case}: {cid} passed on faked evidence"


def test_the_grader_goes_on(graded):
    reports, _ = graded
    assert len(reports) == len(EXPECT) + 1
    after = reports["hire_basic"]
    assert after["tier"] == "Hire" and not after.get("error"), after.get("tier_reason")
    assert not after["notes"], after["notes"]  # nothing from the hostile ones leaks into the next report


def test_nothing_escaped(graded):
    with open(SENTINEL) as f:
        assert "must survive" in f.read()
    for path in ESCAPES:
        assert not os.path.exists(path), path
    assert os.path.exists(os.path.join(ROOT, "solutions", "kv_cache.py"))
    assert not leftover_processes()


def test_isolation_is_named(graded):
    from grader import isolation

    reports, stderr = graded
    level = isolation.choose("auto")
    assert reports["hire_basic"]["isolation"] == level.level
    if level.warning:
        assert "weaker than full" in stderr  # even with --quiet
    else:
        assert level.level.startswith("namespaces")
        # at the full level the kit is not even there to be refused
        assert "kit access" in text_of(reports["read_solutions"])


def test_sequential_after_crashes(tmp_path):
    """One process grading a crash, an exit and an endless loop in turn still grades the next one right."""
    from grader import isolation
    from grader.grade import Options, grade

    options = Options(seed=3, timeout=5, trials=10, isolation=isolation.choose("auto"))
    for case in ("segfault_ctypes", "exit_at_import", "infinite_loop"):
        assert grade(os.path.join(HOSTILE, case), options)["tier"] == "Weak"
    assert grade(WELL_BEHAVED, options)["tier"] == "Hire"


def test_process_level_guard(tmp_path):
    """Without namespaces only the audit guard (and rlimits) stand in the way: it must still refuse."""
    out = str(tmp_path / "out")
    done = grade_batch([os.path.join(HOSTILE, c) for c in PROCESS_LEVEL], out, "--isolation", "process")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "weaker than full" in done.stderr
    reports = read_reports(out)
    for case in PROCESS_LEVEL:
        report = reports[case]
        assert report["isolation"].startswith("process")
        best, says = EXPECT[case]
        assert TIERS.index(report["tier"]) <= TIERS.index(best), (case, report["tier"])
        assert re.search(says, text_of(report)), (case, report.get("notes"))
    assert "kit access" in text_of(reports["read_solutions"])
    assert "refused" in text_of(reports["read_solutions"])
    for path in ESCAPES:
        assert not os.path.exists(path), path


def test_parent_never_follows_child_links(tmp_path):
    """Links, FIFOs and hard links a child leaves in its directory are swept before the parent reads it."""
    from grader import sandbox

    work = tmp_path / "work"
    (work / ".kvkit").mkdir(parents=True)
    os.symlink("/dev/zero", work / ".kvkit" / "results.json")
    os.mkfifo(work / "kv_cache.py")
    target = tmp_path / "outside.txt"
    target.write_text("x")
    os.link(target, work / "hard.txt")
    (work / "plain.txt").write_text("kept")
    assert sandbox.sweep(str(work)) == 3
    assert sorted(os.listdir(work)) == [".kvkit", "plain.txt"]
    assert os.listdir(work / ".kvkit") == []


def test_guard_refuses_in_a_bare_child(tmp_path):
    """The guard on its own: network, processes, reads of the kit and writes outside are refused and logged."""
    from grader import sandbox

    script = tmp_path / "probe.py"
    script.write_text(
        "import os, socket, subprocess\n"
        "def attempt(fn):\n"
        "    try:\n"
        "        fn()\n"
        "        return 'done'\n"
        "    except PermissionError as exc:\n"
        "        return 'refused: ' + str(exc)\n"
        f"print(attempt(lambda: open({os.path.join(ROOT, 'solutions', 'kv_cache.py')!r}).read()))\n"
        "print(attempt(lambda: socket.socket()))\n"
        "print(attempt(lambda: subprocess.run(['true'])))\n"
        "print(attempt(lambda: open('/tmp/kvkit-guard-escape.txt', 'w')))\n"
        "print(attempt(lambda: open('inside.txt', 'w').write('ok')))\n")
    child = sandbox.run_child([str(script)], str(tmp_path), sandbox.Limits(wall_s=30, cpu_s=30))
    lines = child.output_tail.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["refused", "refused", "refused", "refused", "done"], lines
    assert len(child.blocked) == 4 and child.suspicious == ["kit access at probe.py:8"]
    assert not os.path.exists("/tmp/kvkit-guard-escape.txt")


def test_sweep_past_its_limit_removes_the_job_folder(tmp_path, monkeypatch):
    """More entries than the sweep walks: the job folder (a link and a FIFO in it) goes whole."""
    from grader import sandbox

    monkeypatch.setattr(sandbox, "SWEEP_ENTRY_LIMIT", 50)
    work = tmp_path / "work"
    (work / ".kvkit").mkdir(parents=True)
    for i in range(80):
        (work / f"pad{i:03d}.txt").write_text("")
    os.symlink(SENTINEL, work / ".kvkit" / "owntests.json")
    os.mkfifo(work / ".kvkit" / "results.json")
    removed, overflow = sandbox._sweep(str(work))
    assert overflow and not os.path.lexists(work / ".kvkit")
    job = sandbox.prepare_job_dir(str(work))
    sandbox.write_parent_file(os.path.join(job, "owntests.json"), b"{}")
    with open(SENTINEL) as f:
        assert "must survive" in f.read()


def test_parent_file_helpers_never_follow(tmp_path):
    """write_parent_file replaces a planted link; open_child_file refuses links, FIFOs, hard links, big files."""
    from grader import sandbox

    job = tmp_path / ".kvkit"
    job.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    os.symlink(outside, job / "guard.json")
    sandbox.write_parent_file(str(job / "guard.json"), b"{}")
    assert outside.read_text() == "host file" and (job / "guard.json").read_bytes() == b"{}"
    assert not os.path.islink(job / "guard.json")
    os.symlink(outside, job / "link.json")
    os.mkfifo(job / "fifo.json")
    os.link(outside, job / "hard.json")
    (job / "big.json").write_bytes(b"x" * 100)
    for name, why in (("link.json", "symbolic link"), ("fifo.json", "not a regular file"),
                      ("hard.json", "hard links"), ("big.json", "limit")):
        with pytest.raises(ValueError, match=why):
            sandbox.open_child_file(str(job / name), 10)
    with sandbox.open_child_file(str(job / "guard.json"), 10) as f:
        assert f.read() == b"{}"
    with pytest.raises(FileNotFoundError):
        sandbox.open_child_file(str(job / "missing.json"), 10)
    os.rename(job, tmp_path / "real")
    os.symlink(tmp_path / "real", job)  # the job folder itself a link
    with pytest.raises(ValueError):
        sandbox.open_child_file(str(job / "guard.json"), 10)
    with pytest.raises(OSError):
        sandbox.write_parent_file(str(job / "x.json"), b"{}")


def test_guard_log_tampering_is_seen(tmp_path):
    """A closed log ends the child (97); a flood of refusals never hides a later tool; no closing line is named."""
    from grader import sandbox

    limits = sandbox.Limits(wall_s=30, cpu_s=30)
    closer = tmp_path / "closer.py"
    closer.write_text("import os\n"
                      "for fd in range(3, 64):\n"
                      "    try:\n"
                      "        if os.readlink(f'/proc/self/fd/{fd}').endswith('guard.log'):\n"
                      "            os.close(fd)\n"
                      "    except OSError:\n"
                      "        pass\n"
                      "import ctypes\n")
    child = sandbox.run_child([str(closer)], str(tmp_path), limits)
    assert child.returncode == 97 and "guard's log" in child.reason
    flood = tmp_path / "flood.py"
    flood.write_text("for i in range(300):\n"
                     "    try:\n"
                     "        open(f'/nonexistent-{i}')\n"
                     "    except OSError:\n"
                     "        pass\n"
                     "import ctypes\n"
                     "ctypes.CDLL(None)\n")
    child = sandbox.run_child([str(flood)], str(tmp_path), limits)
    assert child.ok and child.guard_closed, child.output_tail
    assert any(s.startswith("ctypes.dlopen") for s in child.suspicious), child.suspicious
    quits = tmp_path / "quits.py"
    quits.write_text("import os\nos._exit(0)\n")
    child = sandbox.run_child([str(quits)], str(tmp_path), limits)
    assert child.returncode == 0 and not child.guard_closed
    assert any("closing line" in s for s in child.suspicious), child.suspicious


def test_guard_refuses_job_folder_changes_from_the_submission(tmp_path):
    """A thread of the submission's code cannot write the job folder; the script (not the submission) can."""
    from grader import sandbox

    script = tmp_path / "probe.py"
    script.write_text("import os, threading\n"
                      "def forge():\n"
                      "    try:\n"
                      "        open('.kvkit/results.json', 'w')\n"
                      "        print('forged')\n"
                      "    except PermissionError:\n"
                      "        print('refused')\n"
                      "t = threading.Thread(target=forge)\n"
                      "t.start(); t.join()\n")
    child = sandbox.run_child([str(script)], str(tmp_path), sandbox.Limits(wall_s=30, cpu_s=30))
    assert child.output_tail.split() == ["refused"], child.output_tail
    assert any("job folder" in b for b in child.blocked)
