"""Figure 4: how fast the grader grades, timed from outside as a user runs it.

``python -m grader SUBMISSION... --jobs N --json FILE --seed 0`` in a child process
(``sys.executable``, the kit's interpreter), wall clock from start to exit, so
interpreter start-up, imports and the sandboxed runs are all counted. The example
submissions are the catalogue's (``catalogue/examples/<name>/``).

- seconds per submission: one submission (``strong_hire``: every criterion runs)
  graded alone, ``--jobs 1``, wall clock of the whole command (the full run). The
  quick run skips this separate run and takes the ``duration_s`` the grader
  reports for each submission of its batch (its own clock, inside the batch);
- submissions per minute: a batch graded with ``--jobs 2`` (the quick run takes
  two submissions, the full run every example), ``60 * count / seconds``.

Where the grader is missing or fails, each figure is ``None`` with the reason.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "catalogue" / "examples"
SINGLE = "strong_hire"


def example_submissions(limit: int | None = None) -> list[Path]:
    """The catalogue's example submissions (directories), ``strong_hire`` first; at most ``limit``."""
    if not EXAMPLES.is_dir():
        return []
    found = sorted((p for p in EXAMPLES.iterdir() if p.is_dir() and (p / "kv_cache.py").exists()),
                   key=lambda p: (p.name != SINGLE, p.name))
    return found[:limit] if limit else found


def run_grader(submissions: list[Path], jobs: int, timeout: float, seed: int = 0) -> dict:
    """Grade ``submissions`` in a child ``python -m grader``; wall seconds and what came back.

    Returns ``{"seconds": float | None, "reports": int, "error": str | None,
    "durations": [report duration_s ...]}``: ``seconds`` is ``None`` and ``error``
    says why when the grader is absent, fails, times out or reports fewer
    submissions than it was given.
    """
    if importlib.util.find_spec("grader.__main__") is None:
        return {"seconds": None, "reports": 0, "durations": [],
                "error": "the grader CLI (python -m grader) is not there yet"}
    with tempfile.TemporaryDirectory(prefix="kvkit-bench-grade-") as tmp:
        report = os.path.join(tmp, "reports.json")
        cmd = [sys.executable, "-m", "grader", *map(str, submissions), "--jobs", str(jobs),
               "--json", report, "--seed", str(seed), "--quiet"]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"seconds": None, "reports": 0, "durations": [],
                    "error": f"python -m grader took more than {timeout:.0f} s"}
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            return {"seconds": None, "reports": 0, "durations": [],
                    "error": f"python -m grader exited {proc.returncode}: {tail[0][:200]}"}
        try:
            with open(report, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            return {"seconds": None, "reports": 0, "durations": [],
                    "error": f"python -m grader wrote no readable --json report ({exc})"}
    reports = data if isinstance(data, list) else [data]
    if len(reports) != len(submissions):
        return {"seconds": None, "reports": len(reports), "durations": [],
                "error": f"{len(reports)} reports for {len(submissions)} submissions"}
    durations = [r.get("duration_s") for r in reports if isinstance(r, dict)]
    return {"seconds": seconds, "reports": len(reports), "durations": durations, "error": None}


def grade_figures(batch: int | None, jobs: int = 2, timeout: float = 600.0, seed: int = 0,
                  single_run: bool = True) -> dict:
    """Figure 4: seconds for one submission alone, and submissions per minute with ``--jobs``.

    Args:
        batch: submissions in the ``--jobs`` batch (``None``: every example).
        jobs: the ``--jobs`` of the batch.
        timeout: seconds allowed to each grader run.
        single_run: grade ``strong_hire`` alone first for the seconds per
            submission; if False, take the mean ``duration_s`` of the batch's reports.

    Returns ``grade_seconds_per_submission`` (float seconds or ``None``),
    ``grade_submissions_per_minute`` (or ``None``), ``grade_jobs``,
    ``grade_batch_size``, ``grade_batch_seconds`` and ``grade_error`` (``None`` or why).
    """
    examples = example_submissions()
    out = {"grade_seconds_per_submission": None, "grade_submissions_per_minute": None,
           "grade_jobs": jobs, "grade_batch_size": 0, "grade_batch_seconds": None, "grade_error": None,
           "grade_single_submission": SINGLE}
    if not examples or examples[0].name != SINGLE:
        out["grade_error"] = f"no example submissions in {EXAMPLES} (want {SINGLE}/)"
        return out
    if single_run:
        single = run_grader(examples[:1], jobs=1, timeout=timeout, seed=seed)
        if single["error"]:
            out["grade_error"] = single["error"]
            return out
        out["grade_seconds_per_submission"] = single["seconds"]
        out["grade_seconds_source"] = f"{SINGLE} graded alone, --jobs 1, wall clock of python -m grader"
        out["grade_single_report_duration_s"] = single["durations"][0] if single["durations"] else None
    chosen = examples[:batch] if batch else examples
    many = run_grader(chosen, jobs=jobs, timeout=timeout, seed=seed)
    out["grade_batch_size"] = len(chosen)
    out["grade_batch"] = [p.name for p in chosen]
    if many["error"]:
        out["grade_error"] = many["error"]
        return out
    out["grade_batch_seconds"] = many["seconds"]
    out["grade_submissions_per_minute"] = 60.0 * len(chosen) / many["seconds"]
    out["grade_batch_report_durations_s"] = many["durations"]
    if not single_run:
        durations = [d for d in many["durations"] if isinstance(d, (int, float))]
        if durations:
            out["grade_seconds_per_submission"] = sum(durations) / len(durations)
            out["grade_seconds_source"] = f"mean duration_s of the reports of the --jobs {jobs} batch"
        else:
            out["grade_seconds_per_submission"] = many["seconds"] * jobs / len(chosen)
            out["grade_seconds_source"] = f"batch wall clock x jobs / submissions (--jobs {jobs})"
    return out
