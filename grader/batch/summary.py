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

Every state reads as in the reports (``report.LABEL``, ``report.STATUS_LABEL``:
pass, fail, not attempted, not measured; graded, not graded, grader error);
every CSV cell goes through ``inert.csv_cell`` (no formula can start a cell).
A hand-back that could not be graded (a blank notebook) scores 0 wherever
grades are merged, as on Gradescope; a grader error has no score.
"""
from __future__ import annotations

import csv
import io
import os
from collections import Counter

from grader.stages.inert import clean, csv_cell, md
from grader.stages.report import LABEL, STATUS_LABEL, criterion_label, merged_score, mistake_sections, status_of, \
    write_text_atomic
from grader.stages.suite import FULL_TRIALS
from grader.stages.verdicts import ReportStatus, Status, Tier

TIERS = list(reversed(Tier))  # best first
GRADED, NOT_GRADED, GRADER_ERROR = ReportStatus.GRADED, ReportStatus.NOT_GRADED, ReportStatus.GRADER_ERROR


def graded(reports: list[dict]) -> list[dict]:
    """The reports with a verdict: every count and rate of a class is over these alone."""
    return [r for r in reports if status_of(r) == GRADED]


def status_counts(reports: list[dict]) -> Counter:
    """How many reports are graded, not graded and grader errors."""
    return Counter(status_of(r) for r in reports)


def rates(reports: list[dict]) -> list[tuple[str, str, int, int]]:
    """``(criterion id, title, passed, attempted)`` for each criterion over the graded reports, in rubric order.

    An optional section left out (``counted`` false in the report) counts neither as passed nor in the
    total; a required one not attempted (no cost.py, no own tests) counts as not passed.
    """
    return [(cid, title, counts[Status.PASS], total - counts["left_out"])
            for cid, title, counts, total in _criterion_counts(reports)]


def _criterion_counts(reports: list[dict]) -> list[tuple[str, str, Counter, int]]:
    order, titles, statuses, graded = [], {}, {}, Counter()
    for r in [r for r in reports if status_of(r) == GRADED]:
        for c in r.get("criteria", []):
            cid = c["id"]
            if cid not in titles:
                order.append(cid)
                titles[cid] = c.get("title", cid)
                statuses[cid] = Counter()
            graded[cid] += 1
            statuses[cid][c.get("status")] += 1
            if not c.get("counted", True) or ("counted" not in c and c.get("status") == Status.NOT_ATTEMPTED
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
    """``summary.md``: status and tier counts, each criterion's pass rate, the mistakes named, and the
    hand-backs not graded with what to fix; every text of a submission's through :func:`grader.stages.inert.md`."""
    n = len(reports)
    statuses = status_counts(reports)
    n_graded = statuses.get(GRADED, 0)
    counts = tier_counts(reports)
    label = _label(rubric, audience)
    lines = [f"# Batch summary: {n} submissions", "",
             f"{n_graded} {STATUS_LABEL[GRADED]}, {statuses.get(NOT_GRADED, 0)} {STATUS_LABEL[NOT_GRADED]}, "
             f"{statuses.get(GRADER_ERROR, 0)} {STATUS_LABEL[GRADER_ERROR]}s. Tiers and rates count graded "
             "submissions only; a submission not graded scores 0 in grades.csv.", ""]
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
    lines += ["", f"| criterion | passed | rate | {LABEL[Status.FAIL]} | {LABEL[Status.NOT_ATTEMPTED]} | "
                  f"{LABEL[Status.ERROR]} |",
              "| --- | --- | --- | --- | --- | --- |"]
    for _, title, status, total in _criterion_counts(reports):
        attempted = total - status["left_out"]
        lines.append(f"| {md(title)} | {status[Status.PASS]}/{attempted} | {_rate(status[Status.PASS], attempted)} | "
                     f"{status[Status.FAIL]} | {status[Status.NOT_ATTEMPTED]} | {status[Status.ERROR]} |")
    mistakes = mistake_counts(reports)
    if mistakes:
        lines += ["", "| mistake | submissions | share |", "| --- | --- | --- |"]
        lines += [f"| `{m}` | {c} | {_rate(c, n_graded)} |"
                  for m, c in sorted(mistakes.items(), key=lambda kv: (-kv[1], kv[0]))]
    for status, words in ((NOT_GRADED, "fix the hand-back; scored 0"), (GRADER_ERROR, "grade again; no score")):
        apart = [r for r in reports if status_of(r) == status]
        if apart:
            lines += ["", f"{STATUS_LABEL[status].capitalize()} ({len(apart)}, {words}):", ""]
            lines += [f"- {md(r.get('submission'), 200)}: {md(_why(r), 600)}" for r in apart]
    levels = Counter(r.get("isolation", "?") for r in graded(reports))
    if levels:
        lines += ["", "Isolation: " + "; ".join(f"{md(level)} ({c})" for level, c in levels.most_common())]
    return "\n".join(lines) + "\n"


def summary_csv(reports: list[dict], rubric=None, audience: str = "hiring") -> str:
    """Class-level rows: ``section,id,title,count,total,rate`` (a tier's title in ``audience``'s words)."""
    n = len(reports)
    out = io.StringIO()
    writer = _Writer(out)
    writer.writerow(["section", "id", "title", "count", "total", "rate"])
    for status in ReportStatus:
        c = status_counts(reports).get(status, 0)
        writer.writerow(["status", status.value, STATUS_LABEL[status], c, n, f"{c / n:.4f}" if n else ""])
    n = len(graded(reports))
    counts = tier_counts(reports)
    label = _label(rubric, audience)
    for t in TIERS:  # a class's summary names its tiers in its own words, in the id column too
        writer.writerow(["tier", t.value if audience == "hiring" else label(t), label(t), counts.get(t, 0), n,
                         f"{counts.get(t, 0) / n:.4f}" if n else ""])
    for cid, title, passed, total in rates(reports):
        writer.writerow(["criterion", cid, title, passed, total, f"{passed / total:.4f}" if total else ""])
    for m, c in sorted(mistake_counts(reports).items()):
        writer.writerow(["mistake", m, m, c, n, f"{c / n:.4f}" if n else ""])
    return out.getvalue()


def csv_text(reports: list[dict], rubric=None, audience: str = "hiring") -> str:
    """One row per submission: status, tier (in ``audience``'s words), score, mistakes and each criterion's
    state (``grades.csv``), in the words of every other output. A report that was not graded has no tier;
    its score is :func:`grader.stages.report.merged_score` (0 for a hand-back that cannot be graded, such as a
    blank notebook; empty for a grader error) and its reason says what to fix."""
    out = io.StringIO()
    writer = _Writer(out)
    ids = [cid for cid, *_ in rates(reports)]
    writer.writerow(["submission", "status", "tier", "score", "max_score", "mistakes", "error"] + ids)
    for r in reports:
        graded_ = status_of(r) == GRADED
        states = {c["id"]: criterion_label(r, c) for c in r.get("criteria", [])} if graded_ else {}
        score = merged_score(r)
        writer.writerow([clean(r.get("submission"), 200), STATUS_LABEL[status_of(r)],
                         _label(rubric, audience)(r["tier"]) if graded_ else "", "" if score is None else score,
                         r.get("max_score"), _mistakes_cell(r), "" if graded_ and not r.get("error") else _why(r)]
                        + [states.get(cid, "") for cid in ids])
    return out.getvalue()


class _Writer:
    """``csv.writer`` whose every cell goes through :func:`grader.stages.inert.csv_cell`."""

    def __init__(self, out):
        self._writer = csv.writer(out)

    def writerow(self, row: list) -> None:
        self._writer.writerow([csv_cell(cell, 600) for cell in row])


def _why(report: dict) -> str:
    """A report's reason, whole: its error, else its tier reason without the state's name."""
    text = clean(report.get("error") or report.get("tier_reason") or "", 600)
    return text.removeprefix(f"{STATUS_LABEL[status_of(report)]}: ")


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
    """The batch's table on ``console``: each submission's verdict, score (as in grades.csv) and mistakes
    or reason, rich ``Text`` (markup off) after :func:`grader.stages.inert.clean`; then the counts."""
    from rich.table import Table
    from rich.text import Text

    from grader.stages.report import headline

    label = _label(rubric, audience)
    table = Table(title=f"{len(reports)} submissions")
    table.add_column("submission")
    table.add_column("tier")
    table.add_column("score", justify="right")
    table.add_column("mistakes")
    for r in reports:
        score = merged_score(r)
        table.add_row(Text(clean(r.get("submission"), 200)), Text(headline(r, rubric, audience)),
                      f"{score:g}" if score is not None else "-",  # as in grades.csv: a grader error has none
                      Text(clean(_mistakes_cell(r)) or ("-" if status_of(r) == GRADED else _why(r))))
    console.print(table)
    counts, statuses = tier_counts(reports), status_counts(reports)
    console.print(Text("  ".join(f"{label(t)}: {counts.get(t, 0)}" for t in TIERS)
                       + f"  |  {STATUS_LABEL[NOT_GRADED]}: {statuses.get(NOT_GRADED, 0)}, "
                       f"{STATUS_LABEL[GRADER_ERROR]}: {statuses.get(GRADER_ERROR, 0)}"))
    ranked = sorted((row for row in rates(reports) if row[3]), key=lambda row: row[2] / row[3])[:3]
    if ranked:
        console.print(Text("lowest pass rates (of the graded; an optional section left out does not count): "
                           + ", ".join(f"{title} {_rate(passed, total)}" for _, title, passed, total in ranked)))
