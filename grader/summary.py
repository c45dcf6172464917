"""A batch at a glance: tier counts and each criterion's pass rate, as Markdown, CSV and a terminal table."""
from __future__ import annotations

import csv
import io
import os
from collections import Counter

from grader.report import write_text_atomic

TIERS = ["Strong Hire", "Hire", "Weak"]


def rates(reports: list[dict]) -> list[tuple[str, str, int, int]]:
    """``(criterion id, title, passed, graded)`` for each criterion, in rubric order."""
    order, titles, passed, graded = [], {}, Counter(), Counter()
    for r in reports:
        for c in r["criteria"]:
            if c["id"] not in titles:
                order.append(c["id"])
                titles[c["id"]] = c["title"]
            graded[c["id"]] += 1
            passed[c["id"]] += c["status"] == "pass"
    return [(cid, titles[cid], passed[cid], graded[cid]) for cid in order]


def tier_counts(reports: list[dict]) -> Counter:
    return Counter(r["tier"] for r in reports)


def markdown(reports: list[dict]) -> str:
    counts = tier_counts(reports)
    lines = [f"# Batch summary: {len(reports)} submissions", "", "| tier | count |", "| --- | --- |"]
    lines += [f"| {t} | {counts.get(t, 0)} |" for t in TIERS]
    lines += ["", "| criterion | passed | rate |", "| --- | --- | --- |"]
    lines += [f"| {title} | {p}/{n} | {p / n:.0%} |" for _, title, p, n in rates(reports)]
    return "\n".join(lines) + "\n"


def csv_text(reports: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["submission", "tier", "score", "max_score", "mistakes"] + [cid for cid, *_ in rates(reports)])
    for r in reports:
        status = {c["id"]: c["status"] for c in r["criteria"]}
        writer.writerow([r["submission"], r["tier"], r["score"], r["max_score"], " ".join(r["mistakes"])]
                        + [status.get(cid, "") for cid, *_ in rates(reports)])
    return out.getvalue()


def write(reports: list[dict], out_dir: str) -> None:
    """``summary.md`` and ``summary.csv`` in ``out_dir``, written atomically."""
    write_text_atomic(os.path.join(out_dir, "summary.md"), markdown(reports))
    write_text_atomic(os.path.join(out_dir, "summary.csv"), csv_text(reports))


def print_summary(reports: list[dict], console) -> None:
    from rich.table import Table

    table = Table(title=f"{len(reports)} submissions")
    table.add_column("submission")
    table.add_column("tier")
    table.add_column("score", justify="right")
    table.add_column("mistakes")
    for r in reports:
        table.add_row(r["submission"], r["tier"], f"{r['score']:g}", ", ".join(r["mistakes"]) or "-")
    console.print(table)
    counts = tier_counts(reports)
    console.print("  ".join(f"{t}: {counts.get(t, 0)}" for t in TIERS))
