"""Fixtures shared by the end-to-end tests.

``example_reports``: the bundled examples that ``make test`` grades (one of each
verdict, ``EXAMPLE_CORE``), graded once through the real command (``kvkit
grade``) and shared by all pytest-xdist workers. The first worker to ask grades
(under a file lock) and writes the reports; the others wait on the lock and read
them (pytest-xdist's documented pattern for a session fixture that must run
once). ``variant_reports``: the other examples (``EXAMPLE_VARIANTS``: more
designs that earn a verdict a core example already earns), graded the same way
by ``make test-slow``.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tomllib

import pytest

from grader.stages.layout import without_iri_format_checker

without_iri_format_checker()  # before any test module imports nbformat or jsonschema (2 CPU-s a worker)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "catalogue", "examples")
EXAMPLES_SEED = 11
EXAMPLES_TRIALS = 30  # random trials per example (the targeted, structure and overflow trials come on top)


def example_split(expected: dict) -> tuple[list, list]:
    """``(core, variants)`` of the examples in ``expected`` (expected.toml's entries, in its order).

    The core holds the first example of each verdict: tier, mistakes, port mistakes and refused parts. A
    variant earns a verdict a core example earns too, through another design (a repeat by broadcasting, a
    concatenation by capacity steps, a Strong Hire with an online softmax, ...).
    """
    core, variants, seen = [], [], set()
    for name, want in expected.items():
        verdict = (want["tier"], *(tuple(sorted(want.get(key, []))) for key in ("mistakes", "port_mistakes",
                                                                                 "refuses")))
        (variants if verdict in seen else core).append(name)
        seen.add(verdict)
    return core, variants


with open(os.path.join(EXAMPLES, "expected.toml"), "rb") as _f:
    EXPECTED = tomllib.load(_f)
EXAMPLE_CORE, EXAMPLE_VARIANTS = example_split(EXPECTED)


def _grade_examples(tmp_path_factory, batch: str, names: list) -> tuple:
    """``names`` graded once per run with the examples' seed and trials, whichever xdist worker comes first:
    ``(reports by submission name, Markdown text, the temp folder the grader used)``."""
    base = tmp_path_factory.getbasetemp()
    # One folder for every xdist worker of this run; without xdist, this run's own (never an earlier run's).
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / batch
    with open(shared / f"{batch}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "all.json").exists():
            tmp = out / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, TMPDIR=str(tmp))  # what the grader leaves there is checked
            done = subprocess.run([sys.executable, "-m", "grader", *(os.path.join(EXAMPLES, n) for n in names),
                                   "--seed", str(EXAMPLES_SEED), "--jobs", "2", "--quiet",
                                   "--trials", str(EXAMPLES_TRIALS), "--json", str(out / "all.json"),
                                   "--markdown", str(out / "all.md")],
                                  cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
            (out / "stderr.txt").write_text(done.stderr)
            assert done.returncode == 0, done.stderr[-2000:]
    with open(out / "all.json") as f:
        reports = json.load(f)
    return {r["submission"]: r for r in reports}, (out / "all.md").read_text(), out / "tmp"


@pytest.fixture(scope="session")
def example_reports(tmp_path_factory):
    """The core examples' reports (``make test``): see ``_grade_examples``."""
    return _grade_examples(tmp_path_factory, "example-reports", EXAMPLE_CORE)


@pytest.fixture(scope="session")
def variant_reports(tmp_path_factory):
    """The variant examples' reports (``make test-slow``): see ``_grade_examples``."""
    return _grade_examples(tmp_path_factory, "variant-reports", EXAMPLE_VARIANTS)


# The end-to-end batches, by the fixture that grades them: each batch's tests run on one xdist worker
# (``--dist loadgroup``, see the Makefile), so no worker waits on a lock while another grades, and the
# largest groups start first.
BATCH_GROUPS = {"example_reports": "examples", "variant_reports": "examples-variants",
                ("test_attacks.py", "graded"): "attacks",
                ("test_attacks.py", "graded_measured"): "attacks-measured", ("test_hostile.py", "graded"): "hostile",
                ("test_hostile.py", "graded_exhausting"): "hostile-exhausting",
                ("test_handback_bounds.py", "graded"): "handbacks"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for key, group in BATCH_GROUPS.items():
            module, fixture = key if isinstance(key, tuple) else (None, key)
            if fixture in fixtures and (module is None or item.path.name == module):
                item.add_marker(pytest.mark.xdist_group(group))
