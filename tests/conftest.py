"""Fixtures shared by the end-to-end tests.

``example_reports``: every bundled example graded once through the real command
(``kvkit grade`` with no SUBMISSION), shared by all pytest-xdist workers. The
first worker to ask grades (under a file lock) and writes the reports; the
others wait on the lock and read them (pytest-xdist's documented pattern for a
session fixture that must run once).
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from grader.submission import without_iri_format_checker

without_iri_format_checker()  # before any test module imports nbformat or jsonschema (2 CPU-s a worker)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES_SEED = 11
EXAMPLES_TRIALS = 30  # random trials per example (the targeted, structure and overflow trials come on top)


@pytest.fixture(scope="session")
def example_reports(tmp_path_factory):
    """``(reports by submission name, Markdown text, the temp folder the grader used)``."""
    base = tmp_path_factory.getbasetemp()
    # One folder for every xdist worker of this run; without xdist, this run's own (never an earlier run's).
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "example-reports"
    with open(shared / "example-reports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "all.json").exists():
            tmp = out / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, TMPDIR=str(tmp))  # what the grader leaves there is checked
            done = subprocess.run([sys.executable, "-m", "grader", "--seed", str(EXAMPLES_SEED), "--jobs", "2",
                                   "--quiet", "--trials", str(EXAMPLES_TRIALS), "--json", str(out / "all.json"),
                                   "--markdown", str(out / "all.md")],
                                  cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
            (out / "stderr.txt").write_text(done.stderr)
            assert done.returncode == 0, done.stderr[-2000:]
    with open(out / "all.json") as f:
        reports = json.load(f)
    return {r["submission"]: r for r in reports}, (out / "all.md").read_text(), out / "tmp"


# The end-to-end batches, by the fixture that grades them: each batch's tests run on one xdist worker
# (``--dist loadgroup``, see the Makefile), so no worker waits on a lock while another grades, and the
# largest groups start first.
BATCH_GROUPS = {"example_reports": "examples", ("test_attacks.py", "graded"): "attacks",
                ("test_attacks.py", "graded_measured"): "attacks-measured", ("test_hostile.py", "graded"): "hostile",
                ("test_hostile.py", "graded_exhausting"): "hostile-exhausting"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for key, group in BATCH_GROUPS.items():
            module, fixture = key if isinstance(key, tuple) else (None, key)
            if fixture in fixtures and (module is None or item.path.name == module):
                item.add_marker(pytest.mark.xdist_group(group))
