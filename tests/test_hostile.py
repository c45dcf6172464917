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
    "infinite_loop": ("Weak", r"did not finish in time|wall time"),
    "memory_hog": ("Weak", r"memory|killed"),
    "fork_bomb": ("Hire", r"."),
    "fork_bomb_ctypes": ("Hire", r"."),
    "exit_at_import": ("Weak", r"without an answer"),
    "sys_exit_at_import": ("Weak", r"failed to import: SystemExit: 3"),
    "exits_in_append": ("Weak", r"raised SystemExit"),
    "segfault_ctypes": ("Weak", r"segmentation fault"),
    "output_flood": ("Hire", r"MiB to stdout/stderr"),
    "read_solutions": ("Weak", r"."),
    "network": ("Hire", r"."),
    "write_outside": ("Hire", r"."),
    "not_arrays": ("Weak", r"returned (NoneType|str|dict|object|_Weird)|raised RuntimeError: no array here"),
    "wrong_dtype": ("Weak", r"dtype (complex128|object|bool|<U)"),
    "wrong_shape": ("Weak", r"expected an array of shape"),
    "huge_array": ("Weak", r"returned ndarray of shape \[1048576, 1048576, 1024\]"),
}
FAKED: dict = {}
TIERS = [None, "Weak", "Hire", "Strong Hire"]


def grade_batch(paths: list[str], out: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVKIT_SANDBOX_MEMORY_MB": "1024"}  # the memory hog stops at 1 GiB
    return subprocess.run([sys.executable, "-m", "grader", *paths, "--out", out, "--quiet", "--jobs", "2",
                           "--timeout", "8", "--trials", "20", "--seed", "7", *extra],
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
    assert report["status"] in ("graded", "not_graded"), report.get("tier_reason")
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
    from grader.sandbox import isolation

    reports, stderr = graded
    level = isolation.choose("auto")
    assert reports["hire_basic"]["isolation"] == level.level
    if level.warning:
        assert "weaker than full" in stderr  # even with --quiet
    else:
        assert level.level.startswith("namespaces")
        # at the full level the kit is not even there to read: no borrowed answer
        assert reports["read_solutions"]["tier"] in ("Weak", None)


def test_fallback_says_plainly_there_is_no_isolation():
    from grader.sandbox import isolation

    level, short = isolation._describe(isolation.Sandbox(namespaces=False), {"uid": 0})
    assert level.startswith("process") and any("NO ISOLATION" in s for s in short)
    assert any("ROOT" in s for s in short)


