"""Grade the candidate's own tests: do they pass on the submission and catch the planted mutants?

The tests run in the sandbox (``owntests_child.py``), once on the submission and
once per planted mutant of the catalogue in its place; the parent reads the exit
codes as data and builds the kill matrix. Strong Hire needs the tests to pass on
the submission and to catch ``chunk_local_mask``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil

from catalogue import mutants
from grader import jobs, sandbox
from grader.evaluate import Criterion

HERE = os.path.dirname(os.path.abspath(__file__))
KEY_MUTANT = "chunk_local_mask"


def test_files(workdir: str) -> list[str]:
    """The candidate's test files, relative to ``workdir``: ``test_*.py`` and ``tests/test_*.py``."""
    found = sorted(glob.glob(os.path.join(workdir, "test_*.py")) + glob.glob(os.path.join(workdir, "tests", "test_*.py")))
    return [os.path.relpath(p, workdir) for p in found]


def run(workdir: str, limits: sandbox.Limits, wrap=None) -> tuple[dict | None, sandbox.ChildResult | None]:
    """Run the tests in the sandbox ``workdir``; ``(results, child)``, or ``(None, None)`` without tests."""
    files = test_files(workdir)
    if not files:
        return None, None
    job = os.path.join(workdir, ".kvkit")
    os.makedirs(job, exist_ok=True)
    shutil.copy(os.path.join(HERE, "owntests_child.py"), os.path.join(job, "owntests_child.py"))
    shutil.copy(mutants.__file__, os.path.join(job, "_kvkit_mutants.py"))
    with open(os.path.join(job, "owntests.json"), "w") as f:
        json.dump({"files": files, "variants": mutants.PLANTED}, f)
    results_path = os.path.join(job, "owntests_results.json")
    if os.path.exists(results_path):
        os.remove(results_path)
    child = sandbox.run_child([os.path.join(job, "owntests_child.py"), job, *sandbox.site_dirs()],
                              workdir, limits, wrap)
    return jobs.read_json(results_path), child


def criterion(results: dict | None, child: sandbox.ChildResult | None, files_found: bool) -> Criterion:
    """The ``own_tests`` criterion and its kill matrix as evidence."""
    if not files_found:
        return Criterion("own_tests", "not_attempted", "no test_*.py in the submission")
    runs = (results or {}).get("runs") if isinstance(results, dict) else None
    if not isinstance(runs, dict) or "none" not in runs:
        why = child.reason if child and child.reason else "the test run did not report"
        return Criterion("own_tests", "error", f"own tests could not be run: {why}")
    code = lambda v: (runs.get(v) or {}).get("exit") if isinstance(runs.get(v), dict) else None
    base = code("none")
    if base == 5:
        return Criterion("own_tests", "fail", "pytest collected no test from the submission's test files")
    if base != 0:
        return Criterion("own_tests", "fail", f"own tests fail on the submission itself (pytest exit {base})")
    if code(mutants.CONTROL) != 0:
        return Criterion("own_tests", "fail", "own tests fail on the submission wrapped with no change in "
                         "behaviour: they detect the grader's wrapping, not mistakes")
    caught = [v for v in mutants.PLANTED if code(v) == 1]
    missed = [v for v in mutants.PLANTED if code(v) == 0]
    broken = [v for v in mutants.PLANTED if code(v) not in (0, 1)]
    matrix = f"caught {len(caught)} of {len(mutants.PLANTED)} planted mistakes: {', '.join(caught) or 'none'}"
    if missed:
        matrix += f"; missed: {', '.join(missed)}"
    if broken:
        matrix += f"; not run: {', '.join(broken)}"
    if child and child.reason and len(runs) < len(mutants.PLANTED) + 2:
        matrix += f" ({child.reason})"
    status = "pass" if KEY_MUTANT in caught else "fail"
    prefix = "pass on the submission; " if status == "pass" else f"pass on the submission but miss {KEY_MUTANT}; "
    return Criterion("own_tests", status, prefix + matrix)
