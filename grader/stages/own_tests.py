"""Grade the candidate's own tests: do they pass on the submission and catch the planted mutants?

Each variant runs in a process of its own, forked from the sandbox's trusted
zygote (``grader/child/run_own_tests.py``): the submission as it is (``none``), the
control (the same wrapper as every mutant, with no change in behaviour) and
each planted mistake. The variant stays in the parent, which answers the
wrapped calls (``grader/stages/variants.py``): a test can tell a mutant only by the
outcomes it checks. The parent reads the exit codes as data and builds the
kill matrix. Strong Hire needs the tests to pass on the submission and on the
control, and to catch ``chunk_local_mask``; a submission that refuses chunked
prefill with a clear error is charged for it once (the chunked-prefill
criterion), and its tests may catch ``ragged_keys_unmasked`` instead, the mask
mistake the calls the refusal does not touch show plainly.
"""
from __future__ import annotations

import glob
import os
import re

from catalogue import mutants
from grader.stages.criteria import Criterion
from grader.stages.verdicts import Status
from grader.stages.inert import shorten, strip

KEY_MUTANT = mutants.MUST_CATCH
# The key mistake a submission that refuses chunked prefill with a clear error may catch instead: the
# chunk-local mask changes mostly the calls it refuses (elsewhere only multi-slot calls that give a row one
# token), so its tests are judged on the calls the refusal does not touch, where this mask mistake shows
# only on rows of different lengths.
KEY_MUTANT_IF_CHUNKS_REFUSED = "ragged_keys_unmasked"


def test_files(workdir: str) -> list[str]:
    """The candidate's test files, relative to ``workdir``: ``test_*.py`` and ``tests/test_*.py``."""
    found = sorted(glob.glob(os.path.join(workdir, "test_*.py")) + glob.glob(os.path.join(workdir, "tests", "test_*.py")))
    return [os.path.relpath(p, workdir) for p in found]


def test_files_in(files: list[str]) -> list[str]:
    """The candidate's test files among ``files`` (paths relative to the submission), as ``test_files`` finds them."""
    return sorted(f for f in files if re.fullmatch(r"(tests/)?test_[^/]*\.py", f.replace(os.sep, "/")))


def _exit_code(run: dict) -> int | None:
    """pytest's exit code from one variant's answer, or None when pytest did not finish there."""
    code = run.get("exit")
    return code if isinstance(code, int) and not isinstance(code, bool) and code >= 0 else None


def _why_not_run(run: dict) -> str:
    """Why pytest did not finish on a variant, from its answer (text of the child's: data)."""
    error = run.get("error")
    if isinstance(error, dict):
        error = f"{error.get('type', '')}: {error.get('message', '')}"
    return shorten(strip(error or "pytest did not finish"), 200)


def _first_failure(run: dict) -> str:
    """The first failing test and its error, numbers to 3 significant digits (the report prints no long value)."""
    failed = run.get("failed") or []
    if not failed:
        return ""
    text = re.sub(r"-?\d+\.\d{4,}(?:[eE][-+]?\d+)?", lambda m: f"{float(m.group()):.3g}", str(failed[0])[:2000])
    return f" (first failure: {shorten(strip(text), 240)})"  # cut at a whole value, its brackets closed


def criterion(session, files: list[str], task_of=None, chunks_refused: bool = False) -> Criterion:
    """The ``own_tests`` criterion, with its kill matrix as evidence.

    ``task_of(variant)`` names the (opaque) task that ran ``variant``.
    ``chunks_refused``: the submission refuses chunked prefill with a clear
    error (that criterion is ``not_attempted``); catching
    ``KEY_MUTANT_IF_CHUNKS_REFUSED`` then passes too.
    """
    if not files:
        return Criterion("own_tests", Status.NOT_ATTEMPTED, "no test_*.py in the submission")
    task_of = task_of or (lambda v: f"own:{v}")
    runs = {}
    for variant in ["none", mutants.CONTROL, *mutants.PLANTED]:
        task = session.tasks.get(task_of(variant)) if session else None
        if task is not None and task.answer is not None:
            runs[variant] = task.answer
    if "none" not in runs:
        task = session.tasks.get(task_of("none")) if session else None
        why = (task.why() if task else "") or (session.reason if session else "") or "the test run did not report"
        return Criterion("own_tests", Status.ERROR, f"own tests could not be run: {why}")
    code = lambda v: _exit_code(runs[v]) if v in runs else None  # noqa: E731
    base = code("none")
    if base is None:
        return Criterion("own_tests", Status.ERROR, "own tests could not be run on the submission: "
                         + _why_not_run(runs["none"]))
    if base == 5:
        return Criterion("own_tests", Status.FAIL, "pytest collected no test from the submission's test files")
    if base in (2, 3, 4):
        # Interrupted (a file that cannot be collected), pytest's own error or a usage error: the tests never
        # ran, so whether they pass is unknown. No guess: say why, and what to fix.
        return Criterion("own_tests", Status.ERROR, f"own tests could not run on the submission (pytest exit {base}: a "
                         f"test file that cannot be imported or collected); they must run with only the "
                         f"submission's files beside them" + _first_failure(runs["none"]))
    if base != 0:
        return Criterion("own_tests", Status.FAIL, f"own tests fail on the submission itself (pytest exit {base})"
                         + _first_failure(runs["none"]))
    if mutants.CONTROL not in runs:
        task = session.tasks.get(task_of(mutants.CONTROL)) if session else None
        why = (task.why() if task else "") or (session.reason if session else "") or "it did not report"
        return Criterion("own_tests", Status.ERROR, f"own tests did not finish on the control (the submission wrapped "
                         f"with no change in behaviour): {why}; the variants run two at a time within the "
                         f"session's time, so tests that take long on one run may not finish them all")
    if code(mutants.CONTROL) is None:
        return Criterion("own_tests", Status.ERROR, "own tests could not be run on the control (the submission "
                         "wrapped with no change in behaviour): " + _why_not_run(runs[mutants.CONTROL]))
    if code(mutants.CONTROL) != 0:
        # Passing on the submission but not under a wrapper that changes no outcome: the planted mistakes
        # cannot be judged, whether the tests look at the wrapper or the wrapper failed them. No guess.
        return Criterion("own_tests", Status.ERROR, "own tests pass on the submission but fail on the control, the "
                         "submission run through the grader's wrapper with every outcome kept (KVCache as a "
                         "subclass, gqa_attention wrapped, each returning a new array, each call sent to the "
                         "grader and back, which adds time per call), so no planted mistake can be judged; tests "
                         "that check outcomes, not the types or object identity of the results and not how long "
                         "calls take, pass there" + _first_failure(runs.get(mutants.CONTROL, {}))
                         + _kept(session, task_of))
    matrix = mutants.kill_matrix({v: code(v) for v in runs})
    keys = [KEY_MUTANT, KEY_MUTANT_IF_CHUNKS_REFUSED] if chunks_refused else [KEY_MUTANT]
    caught = [k for k in keys if k in matrix["caught"]]
    unknown = [k for k in keys if k in matrix["not_run"]]
    if not caught and unknown:
        # Whether the tests catch it is unknown: no guess either way.
        key = unknown[0]
        why = _why_not_run(runs[key]) if key in runs else "the run did not report"
        return Criterion("own_tests", Status.ERROR, f"own tests pass on the submission, but the run on {key} "
                         f"did not finish ({why}); " + matrix["summary"])
    status = "pass" if caught else "fail"
    wanted = " or ".join(keys)
    prefix = "pass on the submission; " if status == Status.PASS else f"pass on the submission but miss {wanted}; "
    if chunks_refused:
        prefix += (f"chunked prefill is refused, so catching {KEY_MUTANT_IF_CHUNKS_REFUSED} (shown on calls the "
                   f"refusal does not touch) does as well as {KEY_MUTANT}; ")
    return Criterion("own_tests", status, prefix + matrix["summary"] + _kept(session, task_of))


def _kept(session, task_of) -> str:
    """What the evidence adds when some attention calls could carry no planted mistake (too large, or outside
    the contract): the same under every variant, so a mutant shows only in the other calls."""
    served = getattr(session, "served", None) or {}
    counts = served.get(task_of(KEY_MUTANT)) or {}
    large, kept = counts.get("too_large", 0), counts.get("kept", 0)
    parts = []
    if large:
        parts.append(f"{large} call(s) too large to plant a mistake in (past the limits of grader/stages/variants.py; "
                     f"smaller inputs are checked)")
    if kept:
        parts.append(f"{kept} call(s) outside the contract's shapes, or that the grader could not compute, "
                     f"kept their own outcome")
    return f"; {'; '.join(parts)}" if parts else ""
