"""A batch at a glance: tier counts and each criterion's pass rate across the class.

``write(reports, out_dir)`` writes three files atomically:

* ``summary.md``: the tier counts, each criterion's pass rate (with how many
  failed, were not attempted or could not be measured), how often each mistake
  was named, the submissions that could not be graded and the isolation used;
* ``summary.csv``: the same class-level figures as rows
  ``section,id,title,count,total,rate`` (section ``tier``, ``criterion`` or
  ``mistake``), for a spreadsheet;
* ``grades.csv``: one row per submission (tier, score, mistakes, each
  criterion's status), for a gradebook.
"""
from __future__ import annotations

import csv
import io
import os
from collections import Counter

from grader.report import clean, md, mistake_sections, status_of, write_text_atomic
from grader.rubric import TIERS as RUBRIC_TIERS
from grader.suite import FULL_TRIALS

TIERS = list(reversed(RUBRIC_TIERS))  # best first


def graded(reports: list[dict]) -> list[dict]:
    """The reports with a verdict: every count and rate of a class is over these alone."""
    return [r for r in reports if status_of(r) == "graded"]


def status_counts(reports: list[dict]) -> Counter:
    """How many reports are graded, not graded and grader errors."""
    return Counter(status_of(r) for r in reports)


def rates(reports: list[dict]) -> list[tuple[str, str, int, int]]:
    """``(criterion id, title, passed, attempted)`` for each criterion over the graded reports, in rubric order.

    An optional section left out (``counted`` false in the report) counts neither as passed nor in the
    total; a required one not attempted (no cost.py, no own tests) counts as not passed.
    """
    return [(cid, title, counts["pass"], total - counts["left_out"])
            for cid, title, counts, total in _criterion_counts(reports)]


def _criterion_counts(reports: list[dict]) -> list[tuple[str, str, Counter, int]]:
    order, titles, statuses, graded = [], {}, {}, Counter()
    for r in [r for r in reports if status_of(r) == "graded"]:
        for c in r.get("criteria", []):
            cid = c["id"]
            if cid not in titles:
                order.append(cid)
                titles[cid] = c.get("title", cid)
                statuses[cid] = Counter()
            graded[cid] += 1
            statuses[cid][c.get("status")] += 1
            if not c.get("counted", True) or ("counted" not in c and c.get("status") == "not_attempted"
                                              and c.get("tier") == "none"):
                statuses[cid]["left_out"] += 1  # an optional section not attempted, or one no figure can judge
    return [(cid, titles[cid], statuses[cid], graded[cid]) for cid in order]


def tier_counts(reports: list[dict]) -> Counter:
    """Tiers of the graded reports only (a report that was not graded has no tier)."""
    return Counter(r.get("tier") for r in graded(reports))


def mistake_counts(reports: list[dict]) -> Counter:
    """Graded submissions per named mistake, the port's apart (``port: kv_repeat``)."""
    counts: Counter = Counter()
    for r in graded(reports):
        numpy_side, port = mistake_sections(r)
        counts.update(set(numpy_side) | {f"port: {m}" for m in port})
    return counts


def _rate(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _label(rubric, audience):
    return (lambda t: rubric.label(t, audience)) if rubric is not None else (lambda t: t)


def markdown(reports: list[dict], elapsed_s: float | None = None, rubric=None, audience: str = "hiring") -> str:
    n = len(reports)
    statuses = status_counts(reports)
    n_graded = statuses.get("graded", 0)
    counts = tier_counts(reports)
    label = _label(rubric, audience)
    lines = [f"# Batch summary: {n} submissions", "",
             f"{n_graded} graded, {statuses.get('not_graded', 0)} not graded, "
             f"{statuses.get('grader_error', 0)} grader errors. Tiers and rates count graded submissions only.", ""]
    if elapsed_s:
        lines += [f"Graded in {elapsed_s:.0f} s ({60 * n / elapsed_s:.1f} submissions per minute).", ""]
    counts_of = [r["trials"]["random"] for r in graded(reports)
                 if isinstance(r.get("trials"), dict) and isinstance(r["trials"].get("random"), int)]
    quick = [c for c in counts_of if c < FULL_TRIALS]
    if quick:
        every = "every submission" if len(quick) == n_graded else f"{len(quick)} of {n_graded} submissions"
        lines += [f"A quick grading: {every} graded with {', '.join(map(str, sorted(set(quick))))} random trials, "
                  f"fewer than the {FULL_TRIALS} of a full one (`--trials`).", ""]
    lines += ["| tier | count | share |", "| --- | --- | --- |"]
    lines += [f"| {md(label(t))} | {counts.get(t, 0)} | {_rate(counts.get(t, 0), n_graded)} |" for t in TIERS]
    lines += ["", "| criterion | passed | rate | failed | not attempted | not measured |", "| --- | --- | --- | --- | --- | --- |"]
    for _, title, status, total in _criterion_counts(reports):
        attempted = total - status["left_out"]
        lines.append(f"| {md(title)} | {status['pass']}/{attempted} | {_rate(status['pass'], attempted)} | "
                     f"{status['fail']} | {status['not_attempted']} | {status['error']} |")
    mistakes = mistake_counts(reports)
    if mistakes:
        lines += ["", "| mistake | submissions | share |", "| --- | --- | --- |"]
        lines += [f"| `{m}` | {c} | {_rate(c, n_graded)} |"
                  for m, c in sorted(mistakes.items(), key=lambda kv: (-kv[1], kv[0]))]
    for status, words in (("not_graded", "Not graded (fix the hand-back)"), ("grader_error", "Grader errors")):
        apart = [r for r in reports if status_of(r) == status]
        if apart:
            lines += ["", f"{words} ({len(apart)}):", ""]
            lines += [f"- {md(r.get('submission'), 200)}: {md(r.get('error') or r.get('tier_reason', ''), 200)}"
                      for r in apart]
    levels = Counter(r.get("isolation", "?") for r in graded(reports))
    if levels:
        lines += ["", "Isolation: " + "; ".join(f"{md(level)} ({c})" for level, c in levels.most_common())]
    return "\n".join(lines) + "\n"


def summary_csv(reports: list[dict], rubric=None, audience: str = "hiring") -> str:
    """Class-level rows: ``section,id,title,count,total,rate`` (a tier's title in ``audience``'s words)."""
    n = len(reports)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["section", "id", "title", "count", "total", "rate"])
    for status in ("graded", "not_graded", "grader_error"):
        c = status_counts(reports).get(status, 0)
        writer.writerow(["status", status, status, c, n, f"{c / n:.4f}" if n else ""])
    n = len(graded(reports))
    counts = tier_counts(reports)
    label = _label(rubric, audience)
    for t in TIERS:
        writer.writerow(["tier", t, label(t), counts.get(t, 0), n, f"{counts.get(t, 0) / n:.4f}" if n else ""])
    for cid, title, passed, total in rates(reports):
        writer.writerow(["criterion", cid, title, passed, total, f"{passed / total:.4f}" if total else ""])
    for m, c in sorted(mistake_counts(reports).items()):
        writer.writerow(["mistake", m, m, c, n, f"{c / n:.4f}" if n else ""])
    return out.getvalue()


def csv_text(reports: list[dict], rubric=None, audience: str = "hiring") -> str:
    """One row per submission: status, tier (in ``audience``'s words), score, mistakes and each criterion's
    status (``grades.csv``). A report that was not graded has no tier and no score."""
    out = io.StringIO()
    writer = csv.writer(out)
    ids = [cid for cid, *_ in rates(reports)]
    writer.writerow(["submission", "status", "tier", "score", "max_score", "mistakes", "error"] + ids)
    for r in reports:
        status = {c["id"]: c["status"] for c in r.get("criteria", [])} if status_of(r) == "graded" else {}
        graded_ = status_of(r) == "graded"
        writer.writerow([clean(r.get("submission"), 200), status_of(r),
                         _label(rubric, audience)(r["tier"]) if graded_ else "", r.get("score") if graded_ else "",
                         r.get("max_score"), _mistakes_cell(r), clean(r.get("error") or "", 200)]
                        + [status.get(cid, "") for cid in ids])
    return out.getvalue()


def write(reports: list[dict], out_dir: str, elapsed_s: float | None = None, rubric=None,
          audience: str = "hiring") -> None:
    """``summary.md``, ``summary.csv`` (class-level) and ``grades.csv`` (per submission) in ``out_dir``."""
    write_text_atomic(os.path.join(out_dir, "summary.md"), markdown(reports, elapsed_s, rubric, audience))
    write_text_atomic(os.path.join(out_dir, "summary.csv"), summary_csv(reports, rubric, audience))
    write_text_atomic(os.path.join(out_dir, "grades.csv"), csv_text(reports, rubric, audience))


def _mistakes_cell(report: dict) -> str:
    """The named mistakes, the port's marked (a port mistake caps the tier; the same name in NumPy is Weak)."""
    numpy_side, port = mistake_sections(report)
    return "; ".join(filter(None, [", ".join(numpy_side), f"port: {', '.join(port)}" if port else ""]))


def print_summary(reports: list[dict], console, rubric=None, audience: str = "hiring") -> None:
    from rich.table import Table
    from rich.text import Text

    from grader.report import headline

    label = _label(rubric, audience)
    table = Table(title=f"{len(reports)} submissions")
    table.add_column("submission")
    table.add_column("tier")
    table.add_column("score", justify="right")
    table.add_column("mistakes")
    for r in reports:
        table.add_row(Text(clean(r.get("submission"), 200)), Text(headline(r, rubric, audience)),
                      f"{r['score']:g}" if status_of(r) == "graded" and isinstance(r.get("score"), (int, float))
                      else "-",  # a report not graded has no score (as in grades.csv), never 0
                      Text(clean(_mistakes_cell(r)) or ("-" if status_of(r) == "graded" else clean(r.get("error"), 160))))
    console.print(table)
    counts, statuses = tier_counts(reports), status_counts(reports)
    console.print(Text("  ".join(f"{label(t)}: {counts.get(t, 0)}" for t in TIERS)
                       + f"  |  not graded: {statuses.get('not_graded', 0)}, grader errors: {statuses.get('grader_error', 0)}"))
    ranked = sorted((row for row in rates(reports) if row[3]), key=lambda row: row[2] / row[3])[:3]
    if ranked:
        console.print(Text("lowest pass rates (of the graded; an optional section left out does not count): "
                           + ", ".join(f"{title} {_rate(passed, total)}" for _, title, passed, total in ranked)))
