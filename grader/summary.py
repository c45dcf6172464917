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

from grader.report import write_text_atomic

TIERS = ["Strong Hire", "Hire", "Weak"]


def rates(reports: list[dict]) -> list[tuple[str, str, int, int]]:
    """``(criterion id, title, passed, graded)`` for each criterion, in rubric order."""
    return [(cid, title, counts["pass"], total) for cid, title, counts, total in _criterion_counts(reports)]


def _criterion_counts(reports: list[dict]) -> list[tuple[str, str, Counter, int]]:
    order, titles, statuses, graded = [], {}, {}, Counter()
    for r in reports:
        for c in r.get("criteria", []):
            cid = c["id"]
            if cid not in titles:
                order.append(cid)
                titles[cid] = c.get("title", cid)
                statuses[cid] = Counter()
            graded[cid] += 1
            statuses[cid][c.get("status")] += 1
    return [(cid, titles[cid], statuses[cid], graded[cid]) for cid in order]


def tier_counts(reports: list[dict]) -> Counter:
    return Counter(r.get("tier") for r in reports)


def mistake_counts(reports: list[dict]) -> Counter:
    return Counter(m for r in reports for m in set(r.get("mistakes", [])))


def _rate(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def markdown(reports: list[dict], elapsed_s: float | None = None) -> str:
    n = len(reports)
    counts = tier_counts(reports)
    lines = [f"# Batch summary: {n} submissions", ""]
    if elapsed_s:
        lines += [f"Graded in {elapsed_s:.0f} s ({60 * n / elapsed_s:.1f} submissions per minute).", ""]
    lines += ["| tier | count | share |", "| --- | --- | --- |"]
    lines += [f"| {t} | {counts.get(t, 0)} | {_rate(counts.get(t, 0), n)} |" for t in TIERS]
    lines += ["", "| criterion | passed | rate | failed | not attempted | not measured |", "| --- | --- | --- | --- | --- | --- |"]
    for _, title, status, total in _criterion_counts(reports):
        lines.append(f"| {title} | {status['pass']}/{total} | {_rate(status['pass'], total)} | {status['fail']} | "
                     f"{status['not_attempted']} | {status['error']} |")
    mistakes = mistake_counts(reports)
    if mistakes:
        lines += ["", "| mistake | submissions | share |", "| --- | --- | --- |"]
        lines += [f"| `{m}` | {c} | {_rate(c, n)} |" for m, c in sorted(mistakes.items(), key=lambda kv: (-kv[1], kv[0]))]
    failed = [r for r in reports if r.get("error")]
    if failed:
        lines += ["", f"Not graded ({len(failed)}):", ""]
        lines += [f"- {r.get('submission')}: {str(r['error']).replace('|', '/')[:200]}" for r in failed]
    levels = Counter(r.get("isolation", "?") for r in reports if not r.get("error") or r.get("isolation") != "none")
    if levels:
        lines += ["", "Isolation: " + "; ".join(f"{level} ({c})" for level, c in levels.most_common())]
    return "\n".join(lines) + "\n"


def summary_csv(reports: list[dict]) -> str:
    """Class-level rows: ``section,id,title,count,total,rate``."""
    n = len(reports)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["section", "id", "title", "count", "total", "rate"])
    counts = tier_counts(reports)
    for t in TIERS:
        writer.writerow(["tier", t, t, counts.get(t, 0), n, f"{counts.get(t, 0) / n:.4f}" if n else ""])
    for cid, title, status, total in _criterion_counts(reports):
        writer.writerow(["criterion", cid, title, status["pass"], total, f"{status['pass'] / total:.4f}" if total else ""])
    for m, c in sorted(mistake_counts(reports).items()):
        writer.writerow(["mistake", m, m, c, n, f"{c / n:.4f}" if n else ""])
    return out.getvalue()


def csv_text(reports: list[dict]) -> str:
    """One row per submission: tier, score, mistakes and each criterion's status (``grades.csv``)."""
    out = io.StringIO()
    writer = csv.writer(out)
    ids = [cid for cid, *_ in rates(reports)]
    writer.writerow(["submission", "tier", "score", "max_score", "mistakes", "error"] + ids)
    for r in reports:
        status = {c["id"]: c["status"] for c in r.get("criteria", [])}
        writer.writerow([r.get("submission"), r.get("tier"), r.get("score"), r.get("max_score"),
                         " ".join(r.get("mistakes", [])), (r.get("error") or "")[:200]]
                        + [status.get(cid, "") for cid in ids])
    return out.getvalue()


def write(reports: list[dict], out_dir: str, elapsed_s: float | None = None) -> None:
    """``summary.md``, ``summary.csv`` (class-level) and ``grades.csv`` (per submission) in ``out_dir``."""
    write_text_atomic(os.path.join(out_dir, "summary.md"), markdown(reports, elapsed_s))
    write_text_atomic(os.path.join(out_dir, "summary.csv"), summary_csv(reports))
    write_text_atomic(os.path.join(out_dir, "grades.csv"), csv_text(reports))


def print_summary(reports: list[dict], console) -> None:
    from rich.table import Table

    table = Table(title=f"{len(reports)} submissions")
    table.add_column("submission")
    table.add_column("tier")
    table.add_column("score", justify="right")
    table.add_column("mistakes")
    for r in reports:
        tier = str(r.get("tier")) if r.get("graded", True) else "not graded"
        table.add_row(str(r.get("submission")), tier, f"{r.get('score', 0):g}",
                      ", ".join(r.get("mistakes", [])) or ("error" if r.get("error") else "-"))
    console.print(table)
    counts = tier_counts(reports)
    console.print("  ".join(f"{t}: {counts.get(t, 0)}" for t in TIERS))
    n = len(reports)
    if n > 1:
        worst = sorted(_criterion_counts(reports), key=lambda row: row[2]["pass"] / max(row[3], 1))[:3]
        console.print("lowest pass rates: " + ", ".join(f"{title} {_rate(s['pass'], total)}"
                                                        for _, title, s, total in worst))
