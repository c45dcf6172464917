"""Reports out: the terminal view, Markdown, Gradescope's results.json, atomic JSON files.

The report dict itself is built in ``grade.py`` (schema ``kvkit.report/1``);
this module only renders and writes it.
"""
from __future__ import annotations

import json
import os
import tempfile

MARK = {"pass": "PASS", "fail": "FAIL", "not_attempted": "----", "error": "ERR "}
STYLE = {"pass": "green", "fail": "red", "not_attempted": "dim", "error": "yellow"}
TIER_STYLE = {"Strong Hire": "bold green", "Hire": "bold cyan", "Weak": "bold red"}


def write_json_atomic(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def write_text_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def print_report(report: dict, console=None) -> None:
    """The at-a-glance terminal view: tier, each criterion with one line of evidence, mistakes, questions."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    tier = report["tier"] if report.get("graded", True) else "NOT GRADED"
    console.rule(f"[bold]{report['submission']}[/]  [{TIER_STYLE.get(tier, 'bold')}]{tier}[/]  "
                 f"{report['score']:g}/{report['max_score']:g}")
    console.print(f"[dim]{report.get('tier_reason', '')} | seed {report['seed']} | {report['duration_s']} s | "
                  f"isolation: {report['isolation']}[/]")
    if report.get("error"):
        console.print(f"[yellow]{report['error']}[/]")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(width=4)
    table.add_column(no_wrap=False)
    table.add_column()
    for c in report["criteria"]:
        table.add_row(f"[{STYLE[c['status']]}]{MARK[c['status']]}[/]", c["title"],
                      f"[dim]{c['evidence']}[/]" + (f" [red]({', '.join(c['mistakes'])})[/]" if c["mistakes"] else ""))
    console.print(table)
    if report.get("mistakes"):
        console.print("[bold red]Mistakes:[/] " + ", ".join(report["mistakes"]))
    if report.get("smallest_failing"):
        console.print(f"[bold]Smallest failing case:[/] {report['smallest_failing']}")
    for note in report.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    if report.get("follow_ups"):
        console.print("[bold]Ask next:[/]")
        for q in report["follow_ups"]:
            console.print(f"  - {q['question']}  [dim]expect: {q['answer']}[/]")


def markdown(reports: list[dict]) -> str:
    """All reports as one Markdown document (a summary table, then one section each)."""
    lines = ["# kvkit grading report", "", "| submission | tier | score | mistakes |", "| --- | --- | --- | --- |"]
    for r in reports:
        lines.append(f"| {r['submission']} | {r['tier']} | {r['score']:g}/{r['max_score']:g} | "
                     f"{', '.join(r['mistakes']) or '-'} |")
    for r in reports:
        lines += ["", f"## {r['submission']}: {r['tier']} ({r['score']:g}/{r['max_score']:g})", "",
                  f"{r.get('tier_reason', '')}. Seed {r['seed']}, isolation: {r['isolation']}.", "",
                  "| criterion | status | points | evidence |", "| --- | --- | --- | --- |"]
        for c in r["criteria"]:
            evidence = c["evidence"].replace("|", "\\|")
            if c["mistakes"]:
                evidence += f" (**{', '.join(c['mistakes'])}**)"
            lines.append(f"| {c['title']} | {c['status']} | {c['points']:g}/{c['max_points']:g} | {evidence} |")
        if r.get("smallest_failing"):
            lines += ["", f"Smallest failing case: {r['smallest_failing']}"]
        for note in r.get("notes", []):
            lines.append(f"- note: {note}")
        if r.get("follow_ups"):
            lines += ["", "Interviewer follow-ups:"]
            lines += [f"- {q['question']} *Expect:* {q['answer']}" for q in r["follow_ups"]]
    return "\n".join(lines) + "\n"


def gradescope(report: dict) -> dict:
    """Gradescope's results.json: ``score``, ``max_score``, ``tests[]`` (name, score, max_score, output, visibility).

    Evidence is already free of hidden values, so every test is visible; the
    follow-up questions are for interviewers and are left out.
    """
    tests = [{"name": c["title"], "score": c["points"], "max_score": c["max_points"],
              "status": "passed" if c["status"] == "pass" else "failed",
              "output": c["evidence"] + (f" Mistakes: {', '.join(c['mistakes'])}." if c["mistakes"] else ""),
              "visibility": "visible"} for c in report["criteria"]]
    output = f"Verdict: {report['tier']}. {report.get('tier_reason', '')}."
    if report.get("smallest_failing"):
        output += f"\nSmallest failing case: {report['smallest_failing']}"
    if report.get("error"):
        output += f"\n{report['error']}"
    return {"score": report["score"], "max_score": report["max_score"], "output": output,
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}
