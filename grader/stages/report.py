"""Reports: how one is made (schema ``kvkit.report/1``, docs/report.schema.json) and every way out.

A report's ``status`` says whether there is a verdict at all: ``graded`` (a
tier), ``not_graded`` (the hand-back cannot be graded: the reason says what to
fix) or ``grader_error`` (the kit failed, not the candidate). Only a graded
report has a tier; every renderer and summary switches on the status.

Text that came from a submission (exception messages, file names) is data:
every renderer passes it through :func:`grader.stages.inert.clean` (one line, no
control, format or separator characters, cut at a whole word), prints it with
rich markup off, escapes it in Markdown (:func:`grader.stages.inert.md`) and keeps it
from starting a formula in CSV (:func:`grader.stages.inert.csv_cell`).

Each state has one name in every human-facing output (:data:`LABEL`,
:data:`STATUS_LABEL`): a criterion passes, fails, is not attempted or is not
measured (``error`` in the JSON: the check could not be made); a report is
graded, not graded or a grader error.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from grader.stages.inert import clean, csv_cell, md, shorten  # noqa: F401 - the renderers' one cleaning, re-exported
from grader.stages.rubric import Tier

SCHEMA = "kvkit.report/1"
STATUSES = ("graded", "not_graded", "grader_error")
STATUS_LABEL = {"graded": "graded", "not_graded": "not graded", "grader_error": "grader error"}
LABEL = {"pass": "pass", "fail": "fail", "not_attempted": "not attempted", "error": "not measured"}
HEADLINE = {s: STATUS_LABEL[s].upper() for s in ("not_graded", "grader_error")}


def status_of(report: dict) -> str:
    """The report's status; reports of older kits (no key) count as graded when they have a tier."""
    status = report.get("status")
    if status in STATUSES:
        return status
    return "graded" if report.get("tier") and report.get("graded", True) else "not_graded"


def reason(report: dict, rubric=None, audience: str = "hiring") -> str:
    """The tier reason in ``audience``'s words."""
    text = str(report.get("tier_reason", ""))
    return rubric.relabel(text, audience) if rubric is not None else text


def headline(report: dict, rubric=None, audience: str = "hiring") -> str:
    """The tier as ``audience`` reads it, or NOT GRADED / GRADER ERROR."""
    status = status_of(report)
    if status != "graded":
        return HEADLINE[status]
    return rubric.label(report["tier"], audience) if rubric is not None else str(report["tier"])


def criterion_label(report: dict, criterion: dict) -> str:
    """What a reader sees for one criterion: pass, fail, not attempted or not measured; in a report
    without a verdict, the report's own state (not graded, grader error), for nothing was checked."""
    status = status_of(report)
    if status != "graded":
        return STATUS_LABEL[status]
    return LABEL.get(criterion.get("status"), clean(criterion.get("status"), 40))


def merged_score(report: dict):
    """The score a gradebook merges: a graded report's score; 0 for a hand-back that cannot be graded
    (a blank notebook, no kv_cache.py: nothing of the student's earns points, as on Gradescope); None
    for a grader error (the kit failed: grade it again)."""
    status = status_of(report)
    if status == "graded":
        score = report.get("score")
        return score if isinstance(score, (int, float)) and not isinstance(score, bool) else None
    return 0.0 if status == "not_graded" else None


def verdict_sentence(report: dict, rubric=None, audience: str = "hiring", word: str = "Verdict") -> str:
    """One sentence that says the verdict (or not graded, grader error) and why, each once:
    ``Result: Needs work — a mistake that decides the verdict alone: kv_repeat.``"""
    status = status_of(report)
    why = clean(reason(report, rubric, audience))
    if status != "graded":
        label = STATUS_LABEL[status]
        why = why.removeprefix(f"{label}: ")  # ungraded() writes "<label>: <what to fix>"
    else:
        label = headline(report, rubric, audience)
        if why.startswith("capped by"):  # the cap is the verdict itself: said once
            why = why.replace(f" (caps the tier at {label})", "")
    if not why:
        return f"{word}: {label}."
    return f"{word}: {label} — {why}{'' if why.endswith('.') else '.'}"


def _error_said(report: dict, said: str) -> str:
    """The report's ``error`` cleaned, or "" when ``said`` (its reason, as shown) holds it already."""
    error = clean(report.get("error") or "")
    return "" if not error or error[:80] in said else error


def ungraded(name: str, seed: int, rubric, reason: str, status: str = "not_graded", started: float | None = None,
             **extra) -> dict:
    """A report without a verdict: ``not_graded`` (fix the hand-back) or ``grader_error`` (the kit failed)."""
    if status not in ("not_graded", "grader_error"):
        raise ValueError(f"status must be not_graded or grader_error, got {status!r}")
    reason = clean(reason, 600)
    words = status.replace("_", " ")
    crits = [{"id": cid, "title": rubric.title(cid), "status": "error", "points": 0.0,
              "max_points": float(spec["points"]), "evidence": f"{words} (see the reason)", "mistakes": []}
             for cid, spec in rubric.criteria.items()]
    report = {"schema": SCHEMA, "submission": name, "seed": seed, "status": status, "tier": None, "graded": False,
              "tier_reason": f"{words}: {reason}", "score": 0.0, "max_score": rubric.max_score, "criteria": crits,
              "mistakes": [], "isolation": "none", "error": reason, "notes": [], "follow_ups": [],
              "smallest_failing": None,
              "duration_s": round(time.monotonic() - started, 2) if started is not None else 0.0}
    report.update(extra)
    return report

STYLE = {"pass": "green", "fail": "red", "not_attempted": "dim", "error": "yellow"}
TIER_STYLE = {Tier.STRONG_HIRE: "bold green", Tier.HIRE: "bold cyan", Tier.WEAK: "bold red"}


def write_json_atomic(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    write_text_atomic(path, json.dumps(data, indent=2), suffix=".json")


def write_text_atomic(path: str, text: str, suffix: str = "") -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename; raises OSError (the temporary file
    removed) when the folder or the name cannot take it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    try:
        # A file name that is not UTF-8 (Linux allows any bytes) reaches here as a lone surrogate: escaped.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for the course staff to read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def print_report(report: dict, console=None, rubric=None, audience: str = "hiring") -> None:
    """The at-a-glance terminal view: tier, each criterion with one line of evidence, mistakes, questions.

    Every string is printed as rich ``Text`` (markup off) after :func:`clean`:
    a submission's exception message can neither style nor break the output.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    title = headline(report, rubric, audience)
    status = status_of(report)
    graded = status == "graded"
    score = merged_score(report)
    rule = Text.assemble((clean(report["submission"], 200), "bold"), "  ",
                         (title, TIER_STYLE.get(report.get("tier") if graded else "", "bold yellow")),
                         f"  {score:g}/{report['max_score']:g}" if score is not None else "")
    console.rule(rule)
    if not graded:  # no verdict: the reason and what to fix, not a table of criteria that were never run
        ran = report.get("isolation") not in (None, "none")  # nothing of a hand-back refused before it ran
        console.print(Text(clean(reason(report, rubric, audience)) + (f" | isolation: {clean(report['isolation'])}"
                                                                      if ran else ""), style="yellow"))
        for note in report.get("notes", []):
            console.print(Text.assemble(("note: ", "yellow"), clean(note)))
        return
    said = clean(reason(report, rubric, audience))
    console.print(Text(f"{said} | seed {report['seed']} | {report['duration_s']} s | "
                       f"isolation: {clean(report['isolation'])}", style="dim"))
    error = _error_said(report, said)
    if error:
        console.print(Text(error, style="yellow"))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(width=max(map(len, LABEL.values())))
    table.add_column(no_wrap=False)
    table.add_column()
    for c in report["criteria"]:
        evidence = Text(clean(c["evidence"]), style="dim")
        if c["mistakes"]:
            evidence.append(f" ({', '.join(clean(m, 80) for m in c['mistakes'])})", style="red")
        table.add_row(Text(criterion_label(report, c), style=STYLE.get(c["status"], "")), Text(clean(c["title"])),
                      evidence)
    console.print(table)
    if report.get("mistakes"):
        console.print(Text.assemble(("Mistakes: ", "bold red"), clean(mistakes_line(report, rubric, audience))))
    if report.get("smallest_failing"):
        console.print(Text.assemble(("Smallest failing case: ", "bold"), clean(report["smallest_failing"])))
    diagnosis = report.get("diagnosis") or {}
    if diagnosis:
        console.print(Text.assemble(("Diagnosis: ", "bold"), clean(diagnosis.get("summary", ""))))
        for line in diagnosis.get("lines", []):
            console.print(Text("  " + clean(line)), highlight=False)
    for note in report.get("notes", []):
        console.print(Text.assemble(("note: ", "yellow"), clean(note)))
    if report.get("follow_ups") and audience == "hiring":
        console.print(Text("Ask next:", style="bold"))
        for q in report["follow_ups"]:
            console.print(Text.assemble(f"  - {clean(q['question'])}  ", (f"expect: {clean(q['answer'])}", "dim")))


def mistake_sections(report: dict) -> tuple[list, list]:
    """``(the NumPy part's mistakes, the port's)``: a name in the port caps the tier, the same name in
    NumPy may make it Weak, so the two are never counted as one."""
    port = list(report.get("port_mistakes") or [])
    numpy_side = report.get("numpy_mistakes")
    if numpy_side is None:  # reports of older kits
        numpy_side = [m for m in report.get("mistakes", []) if m not in port]
    return list(numpy_side), port


def mistakes_line(report: dict, rubric=None, audience: str = "hiring") -> str:
    """Named mistakes tagged by section: ``numpy: a, b; port: kv_repeat (caps the tier at Hire)``, the cap's
    tier in ``audience``'s words."""
    numpy_side, port = mistake_sections(report)
    parts = [f"numpy: {', '.join(numpy_side)}"] if numpy_side else []
    if port:
        cap = report.get("port_cap")
        if cap and rubric is not None:
            cap = rubric.label(cap, audience)
        parts.append(f"port: {', '.join(port)}" + (f" (caps the tier at {cap})" if cap else ""))
    return "; ".join(parts)


def write_markdown(path: str, reports: list[dict], rubric=None, audience: str = "hiring") -> None:
    """Write the Markdown report to ``path`` and each diagnosis picture as a PNG beside it (``<stem>-img/``)."""
    from grader.stages import pictures

    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.join(os.path.dirname(os.path.abspath(path)), f"{stem}-img")
    images = {}
    for i, r in enumerate(reports):
        for kind, pic in ((r.get("diagnosis") or {}).get("pictures") or {}).items():
            name = f"{i:03d}-{kind}.png"  # by position: no text of the submission's in a path or a link
            pictures.save(pic, kind, os.path.join(folder, name))
            images.setdefault(i, []).append((kind, f"{stem}-img/{name}"))
    write_text_atomic(path, markdown(reports, rubric, audience, images))


def markdown(reports: list[dict], rubric=None, audience: str = "hiring", images: dict | None = None) -> str:
    """All reports as one Markdown document (a summary table, then one section each); all text escaped.

    ``images``: report index -> ``[(kind, relative PNG path)]`` written by :func:`write_markdown`.
    """
    images = images or {}

    def score(r):
        merged = merged_score(r)
        return f"{merged:g}/{r['max_score']:g}" if merged is not None else f"-/{r['max_score']:g}"

    lines = ["# kvkit grading report", "", "| submission | tier | score | mistakes |", "| --- | --- | --- | --- |"]
    for r in reports:
        lines.append(f"| {md(r['submission'], 200)} | {md(headline(r, rubric, audience))} | "
                     f"{score(r)} | {md(', '.join(r['mistakes'])) or '-'} |")
    for i, r in enumerate(reports):
        said = md(reason(r, rubric, audience))
        lines += ["", f"## {md(r['submission'], 200)}: {md(headline(r, rubric, audience))} ({score(r)})", "",
                  f"{said}{'' if said.endswith('.') else '.'} Seed {r['seed']}, isolation: {md(r['isolation'])}."]
        if status_of(r) != "graded":  # no verdict: the reason says what to fix; no criterion was checked
            lines += [f"- note: {md(note)}" for note in r.get("notes", [])]
            continue
        error = _error_said(r, clean(reason(r, rubric, audience)))
        if error:
            lines += ["", md(error)]
        lines += ["", "| criterion | status | points | evidence |", "| --- | --- | --- | --- |"]
        for c in r["criteria"]:
            evidence = md(c["evidence"])
            if c["mistakes"]:
                evidence += f" (**{md(', '.join(c['mistakes']))}**)"  # catalogue ids, escaped all the same
            lines.append(f"| {md(c['title'])} | {criterion_label(r, c)} | {c['points']:g}/{c['max_points']:g} | "
                         f"{evidence} |")
        if r.get("mistakes"):
            lines += ["", f"Mistakes: {md(mistakes_line(r, rubric, audience))}"]
        if r.get("smallest_failing"):
            lines += ["", f"Smallest failing case: {md(r['smallest_failing'])}"]
        diagnosis = r.get("diagnosis") or {}
        if diagnosis:
            lines += ["", f"Diagnosis: {md(diagnosis.get('summary', ''))}"]
            if diagnosis.get("lines"):
                lines += ["", "```text", *[clean(line).replace("`", "'") for line in diagnosis["lines"]], "```"]
            lines += [f"![{kind}]({src})" for kind, src in images.get(i, [])]
        for note in r.get("notes", []):
            lines.append(f"- note: {md(note)}")
        if r.get("follow_ups") and audience == "hiring":
            lines += ["", "Interviewer follow-ups:"]
            lines += [f"- {md(q['question'])} *Expect:* {md(q['answer'])}" for q in r["follow_ups"]]
    return "\n".join(lines) + "\n"


def gradescope(report: dict, rubric=None, audience: str = "class") -> dict:
    """Gradescope's results.json: ``score``, ``max_score``, ``tests[]`` (name, score, max_score, output, visibility).

    Points per criterion; the tier in ``audience``'s words (a class by
    default). Evidence is already free of hidden values, so every test is
    visible; the follow-up questions are for interviewers and are left out.
    """
    tests = [{"name": clean(c["title"]), "score": c["points"], "max_score": c["max_points"],
              "status": "passed" if c["status"] == "pass" else "failed",
              "output": _test_output(report, c), "visibility": "visible"}
             for c in report["criteria"] if c.get("counted", True)]
    word = "Result" if audience == "class" else "Verdict"
    output = verdict_sentence(report, rubric, audience, word)
    if status_of(report) == "graded":
        for status in ("not_attempted", "error"):
            left_out = [clean(c["title"]) for c in report["criteria"]
                        if not c.get("counted", True) and c.get("status") == status]
            if left_out:
                output += (f"\n{LABEL[status].capitalize()}, optional: {'; '.join(left_out)}. It counts neither "
                           f"for nor against: the other points are scaled to {report['max_score']:g}.")
    if report.get("smallest_failing"):
        output += f"\nSmallest failing case: {clean(report['smallest_failing'])}"
    diagnosis = report.get("diagnosis") or {}
    if diagnosis:
        output += f"\nDiagnosis: {clean(diagnosis.get('summary', ''))}"
        output += "".join(f"\n  {clean(line)}" for line in diagnosis.get("lines", []))
    error = _error_said(report, output)
    if error:
        output += f"\n{error}"
    score = merged_score(report)
    return {"score": score if score is not None else 0.0, "max_score": report["max_score"], "output": output,
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def _test_output(report: dict, criterion: dict) -> str:
    """One Gradescope test's output: the criterion's state in words, then its evidence and mistakes."""
    label = criterion_label(report, criterion)
    if status_of(report) != "graded":
        return label  # the headline says why, once
    evidence = clean(criterion.get("evidence") or "")
    text = evidence if evidence.lower().startswith(label) else f"{label}: {evidence}" if evidence else label
    mistakes = criterion.get("mistakes") or []
    return text + (f" Mistakes: {clean(', '.join(mistakes))}." if mistakes else "")
