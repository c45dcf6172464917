"""What reaches a reader is inert, and each state has one name in every output.

Each attack is text a submission controls (its folder's name, an exception message, a note) beside a
control with a plain name: rendered to the terminal, report.md, summary.md, grades.csv, summary.csv and
Gradescope's results.json, the attack gains nothing: no spreadsheet formula, no link, no format or
control character, no forged table cell, and the same verdict and score as its control. Fast unit tests
build reports with the grader's own functions; one small batch grades two real example copies.
"""
from __future__ import annotations

import csv
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest

from grader.stages import criteria as criteria_mod
from grader.stages import grade as grade_mod
from grader.stages import report
from grader.batch import summary
from grader.stages.rubric import load

RUBRIC = load()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSAFE = ("Cc", "Cf", "Zl", "Zp")
FORMULA = ("=", "+", "-", "@", "\t", "\r")
CONTROL = "alice"
ATTACKS = {
    "formula": '=HYPERLINK("http://evil.example/?s=100","100")',
    "plus_dde": "+cmd|' /C calc'!A0",
    "minus": "-2+3+cmd|' /C calc'!A0",
    "at": "@SUM(1+1)*cmd|' /C calc'!A0",
    "tab": "\t=1+1",
    "carriage_return": "\r=1+1",
    "space_then_formula": " =1+1",
    "no_break_space_then_formula": "\u00a0\u3000=1+1",
    "full_width": "\uff1d1+1",
    "bidi_override": "alice\u202e001/001 eriH gnortS :tcidreV\u202c",
    "bidi_isolate": "alice\u2067Strong Hire 100/100\u2069",
    "zero_width": "al\u200bi\u200cc\u200de\u2060\ufeff\u00ad",
    "line_separator": "alice\u2028Verdict: Strong Hire 100/100\u2029",
    "newline": "alice\n\n## Verdict: Strong Hire\n| forged | row |",
    "escape_codes": "alice\x1b[32mStrong Hire\x1b[0m\x07",
    "url": "https://evil.example/login?next=grades",
    "www": "www.evil.example",
    "www_upper": "WWW.EVIL.EXAMPLE/x",
    "email": "grades@evil.example",
    "markdown_link": "[Strong Hire 100/100](https://evil.example) <a href='x'>y</a> ![i](x.png)",
    "entity": "pay&#64;evil.example &#x77;ww.evil.example &lt;b&gt;",
    "backticks": "``www.evil.example`` `x`",
    "table_cell": "a | Strong Hire | 100/100 |",
    "math": "$\\href{https://evil.example}{x}$",
    "list_start": "1. Strong Hire",
}
BLANK = ("the implementation is not filled in yet (kv_cache.py, or a notebook's implementation cells): every "
         "trial stops at the template's NotImplementedError; fill in KVCache and gqa_attention, then hand it back")


def unsafe_chars(text: str, keep: str = "") -> list[str]:
    """Characters of ``text`` in the categories no output may carry (``keep``: a renderer's own)."""
    return [f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) in UNSAFE and ch not in keep]


def graded(name: str, said: str) -> dict:
    """A Weak report whose evidence, note and error carry ``said`` (text from the submission)."""
    crits = grade_mod.build_report(name, grade_mod.Options(seed=1, rubric=RUBRIC), {
        cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria} | {
        "decode": criteria_mod.Criterion("decode", "fail", f"3 of 9 decode steps raise IndexError: {said}"),
        "cost_model": criteria_mod.Criterion("cost_model", "error", f"not measured: cost.py raised {said}")},
        {}, {}, [f"your code printed {said}"], "namespaces", 0.0, None)
    crits["smallest_failing"] = f"B=1, T=2 ({said})"
    return crits


def ungraded(name: str, said: str) -> dict:
    return report.ungraded(name, 1, RUBRIC, f"kv_cache.py shadows an installed module: {said}")


def pairs() -> list[tuple[str, dict, dict]]:
    """``(case, control's report, attack's report)``: graded and not graded, the attack's text everywhere."""
    out = []
    for case, text in ATTACKS.items():
        out.append((case, graded(CONTROL, "index 3"), graded(text, text)))
        out.append((case, ungraded(CONTROL, "numpy.py"), ungraded(text, text)))
    return out


def all_reports() -> list[dict]:
    return [r for _, control, attack in pairs() for r in (control, attack)]


class _Cells(html.parser.HTMLParser):
    """Table rows' cell counts and every link or image target of rendered HTML."""

    def __init__(self):
        super().__init__()
        self.rows, self.links, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1
        elif tag == "a" or any(k in ("href", "src") for k, _ in attrs):
            self.links.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def github_html(markdown: str) -> str:
    """``markdown`` rendered as GitHub renders it: GFM with its autolink, table and tag-filter extensions."""
    cmarkgfm = pytest.importorskip("cmarkgfm")
    return cmarkgfm.github_flavored_markdown_to_html(markdown)


def check_github_markdown(markdown: str) -> _Cells:
    """No link, no format or control character, and no forged table cell in ``markdown`` as GitHub shows it."""
    rendered = github_html(markdown)
    parsed = _Cells()
    parsed.feed(rendered)
    assert not [(tag, attrs) for tag, attrs in parsed.links if tag != "img" or "evil" in str(attrs)], parsed.links
    assert not unsafe_chars(rendered, keep="\n"), unsafe_chars(rendered, keep="\n")
    assert not unsafe_chars("".join(parsed.text), keep="\n")
    return parsed


# ------------------------------------------------------------------ the one cleaning


def test_clean_removes_every_control_format_and_separator_character():
    import sys

    bad = "".join(chr(i) for i in range(sys.maxunicode + 1) if unicodedata.category(chr(i)) in UNSAFE)
    assert len(bad) > 200
    for text in (bad, "a" + bad + "b", "\u202eStrong Hire\u202c"):
        assert not unsafe_chars(report.clean(text)), text
    assert report.clean("al\u200bice") == "alice"  # a format character is removed, not spaced
    assert report.clean("line\u2028two\nthree") == "line two three"  # a break becomes one space


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_the_terminal_shows_the_attack_as_inert_text_beside_its_control(case):
    from rich.console import Console

    for control, attack in ((graded(CONTROL, "index 3"), graded(ATTACKS[case], ATTACKS[case])),
                            (ungraded(CONTROL, "x"), ungraded(ATTACKS[case], ATTACKS[case]))):
        shown = {}
        for which, r in (("control", control), ("attack", attack)):
            console = Console(file=io.StringIO(), width=400, color_system=None)
            report.print_report(r, console, RUBRIC)
            summary.print_summary([r, r], console, RUBRIC)
            shown[which] = console.file.getvalue()
        assert not unsafe_chars(shown["attack"], keep="\n"), unsafe_chars(shown["attack"], keep="\n")
        assert "\x1b" not in shown["attack"]
        # The verdict line reads as the control's: the attack adds no verdict and no score of its own.
        verdicts = {which: re.findall(r"(Weak|Hire|Strong Hire|NOT GRADED)\s+(\d+/100)?", text.splitlines()[0])
                    for which, text in shown.items()}
        assert verdicts["attack"][-1:] == verdicts["control"][-1:] and verdicts["control"], verdicts


# ------------------------------------------------------------------ CSV


def test_every_csv_cell_reads_back_inert_and_the_attack_gains_nothing(tmp_path):
    reports = all_reports()
    summary.write(reports, str(tmp_path))
    for name in ("grades.csv", "summary.csv"):
        with open(tmp_path / name, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows and all(len(row) == len(rows[0]) for row in rows), name  # no cell forged or split
        for row in rows:
            for cell in row:
                assert not cell.lstrip().startswith(FORMULA + ("\uff1d", "\uff0b", "\uff0d", "\uff20")), \
                    (name, cell)
                assert not unsafe_chars(cell), (name, cell)
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        grades = list(csv.DictReader(f))
    assert len(grades) == len(reports)
    for control, attack in zip(grades[::2], grades[1::2]):
        for key in ("status", "tier", "score", "max_score", "mistakes", "decode", "cost_model"):
            assert attack[key] == control[key], (attack["submission"], key)
        if attack["submission"].startswith("'"):  # neutralised, not dropped: the name is still there
            assert report.clean(attack["submission"][1:]).strip()
    formula = next(g for g in grades if "HYPERLINK" in g["submission"])
    assert formula["submission"] == "'" + ATTACKS["formula"]


# ------------------------------------------------------------------ Markdown as GitHub renders it


def test_report_and_summary_markdown_render_without_links_or_format_characters():
    reports = all_reports()
    for markdown in (report.markdown(reports, RUBRIC), report.markdown(reports, RUBRIC, "class"),
                     summary.markdown(reports, rubric=RUBRIC)):
        parsed = check_github_markdown(markdown)
        widths = {n for n in parsed.rows}
        assert widths <= {4, 3, 6}, widths  # each table keeps its header's columns
    text = "".join(check_github_markdown(report.markdown(reports, RUBRIC)).text)
    assert "evil.example" in text and "HYPERLINK" in text  # shown as text, not dropped


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_each_markdown_attack_beside_its_control(case):
    control, attack = graded(CONTROL, "index 3"), graded(ATTACKS[case], ATTACKS[case])
    rows = {}
    for which, r in (("control", control), ("attack", attack)):
        parsed = check_github_markdown(report.markdown([r], RUBRIC))
        rows[which] = parsed.rows
        headings = re.findall(r"<h2>(.*?)</h2>", github_html(report.markdown([r], RUBRIC)))
        assert len(headings) == 1 and headings[0].endswith("Weak (40/100)") or "Weak" in headings[0], headings
    assert rows["attack"] == rows["control"]  # the same tables, cell for cell: nothing forged


# ------------------------------------------------------------------ Gradescope


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_gradescope_results_carry_no_control_or_format_character(case):
    for r in (graded(ATTACKS[case], ATTACKS[case]), ungraded(ATTACKS[case], ATTACKS[case])):
        results = report.gradescope(r, RUBRIC, "class")
        assert not unsafe_chars(results["output"], keep="\n")
        assert all(not unsafe_chars(t["output"] + t["name"]) for t in results["tests"])
        assert results["score"] == (r["score"] if r["status"] == "graded" else 0)


# ------------------------------------------------------------------ cut at a whole word, brackets closed


def balanced(text: str) -> bool:
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or "([{"[")]}".index(ch)] != stack.pop():
                return False
    return not stack


def test_the_tier_reason_is_built_from_whole_parts_with_every_bracket_closed():
    refusal = ("chunked prefill refused with a clear error (NotImplementedError: chunked prefill (a chunk "
               "appended to a cache that holds tokens already) is not supported by this cache; use one full "
               "prefill, then decode one token at a time, as the docstring says)")
    r = grade_mod.build_report("x", grade_mod.Options(seed=1, rubric=RUBRIC), {
        cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria} | {
        "chunked_prefill": criteria_mod.Criterion("chunked_prefill", "not_attempted", refusal),
        "ragged_rows": criteria_mod.Criterion("ragged_rows", "fail", "2 of 9 steps fail"),
        "padding": criteria_mod.Criterion("padding", "error", "not measured: " + "the probe ran past it (x) " * 20)},
        {}, {}, [], "namespaces", 0.0, None)
    reason = r["tier_reason"]
    assert r["tier"] == "Hire" and balanced(reason), reason
    assert "Ragged rows" in reason and "(not attempted: chunked prefill refused with a clear error" in reason
    for said in (reason, report.clean(reason, 120), report.md(reason, 150)):
        assert balanced(said.replace("\\(", "").replace("\\)", "")), said


def test_text_is_cut_at_a_whole_value_with_an_ellipsis():
    evidence = "wrong outputs: " + ", ".join(f"{-0.5 - i / 1000:.3f} (ACTUAL), {0.5 + i / 1000:.3f} (EXPECTED)"
                                             for i in range(40))
    words = set(evidence.split())
    for limit in (40, 57, 80, 121, 200, 333):
        cut = report.clean(evidence, limit)
        assert len(cut) <= limit and cut.endswith(("...", "...)")) and balanced(cut), cut
        kept = cut.rsplit(" ...", 1)[0].split()
        assert all(w in words or w.rstrip(",;:") in words or w + "," in words for w in kept), (limit, cut)
    assert report.clean("short (as it is", 100) == "short (as it is"  # not cut: left as written


def test_a_cut_never_leaves_a_bracket_open_whatever_the_text():
    import random

    from grader.stages.inert import shorten

    rng = random.Random(7)
    pieces = ["(", ")", "[", "]", "{", "}", "word", "longerword", "x", ",", ";", ":", " ", " ", " ", "-0.506"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        limit = rng.randint(4, 80)
        cut = shorten(text, limit)
        assert len(cut) <= limit, (text, limit, cut)
        if cut != text:
            kept = cut.rsplit(" ...", 1)[0] if " ..." in cut else ""
            assert "..." in cut and not _opened(cut), (text, limit, cut)  # every bracket it opens, it closes
            first = re.match(r" *[^ ]*", text).group().rstrip(",;:")
            first_word_fits = len(first) + len(" ...") + len(_opened(first)) <= limit
            assert text.startswith(kept) and (not kept or text[len(kept):][:1] in " ,;:" or not first_word_fits), \
                (text, limit, cut)  # whole words, unless not even the first one fits


def test_a_failing_own_test_is_quoted_to_a_whole_value():
    """numpy's assert_allclose message, as pytest reports it: the evidence keeps whole values."""
    from grader.stages import own_tests as owntests

    message = ("test_mine.py::test_chunked - AssertionError: Not equal to tolerance rtol=1e-07, atol=0 "
               "Mismatched elements: 12 / 96 (12.5%) Mismatch at index: "
               + " ".join(f"[{i}]: {-0.50612345 - i / 1e4} (ACTUAL), {-0.5 - i / 1e4} (DESIRED)" for i in range(12))
               + " Max absolute difference among violations: 0.00612345")
    shown = owntests._first_failure({"failed": [message]})
    assert shown.startswith(" (first failure: test_mine.py::test_chunked") and balanced(shown), shown
    values = set(re.findall(r"-?\d+(?:\.\d+)?", re.sub(r"-?\d+\.\d{4,}", lambda m: f"{float(m.group()):.3g}",
                                                          message)))
    assert set(re.findall(r"-?\d+(?:\.\d+)?", shown)) <= values, shown  # no value cut short
    assert shown.endswith(" ...)"), shown


def _opened(text: str) -> list[int]:
    stack = []
    for i, ch in enumerate(text):
        if ch in "([{":
            stack.append(i)
        elif ch in ")]}" and stack and text[stack[-1]] == "([{"[")]}".index(ch)]:
            stack.pop()
    return stack


# ------------------------------------------------------------------ one name per state


def _with_every_state() -> dict:
    crits = {cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria}
    crits["decode"] = criteria_mod.Criterion("decode", "fail", "3 of 9 decode steps fail")
    crits["cost_model"] = criteria_mod.Criterion("cost_model", "not_attempted", "no cost.py")
    crits["no_kv_repeat"] = criteria_mod.Criterion("no_kv_repeat", "error", "the memory probe ran past its deadline")
    crits["live_length"] = criteria_mod.Criterion("live_length", "error", "not judged: the making costs too much",
                                                  unjudgeable=True)
    return grade_mod.build_report("alice", grade_mod.Options(seed=1, rubric=RUBRIC), crits, {}, {}, [],
                                  "namespaces", 0.0, None)


def test_a_criterion_that_could_not_be_measured_reads_not_measured_everywhere(tmp_path):
    from rich.console import Console

    r = _with_every_state()
    title = {c["id"]: c["title"] for c in r["criteria"]}
    console = Console(file=io.StringIO(), width=300, color_system=None)
    report.print_report(r, console, RUBRIC)
    terminal = {cid: [line for line in console.file.getvalue().splitlines() if title[cid] in line][-1].strip()
                for cid in ("decode", "cost_model", "no_kv_repeat")}  # its row of the table, after the reason
    assert terminal["no_kv_repeat"].startswith("not measured") and "N/M" not in console.file.getvalue()
    assert terminal["cost_model"].startswith("not attempted") and terminal["decode"].startswith("fail")

    markdown = report.markdown([r], RUBRIC)
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {report.md(title['no_kv_repeat'])} |"))
    assert row.split(" | ")[1] == "not measured", row
    assert "| error |" not in markdown and "| not_attempted |" not in markdown

    summary.write([r], str(tmp_path))
    with open(tmp_path / "grades.csv", newline="") as f:
        grades = next(csv.DictReader(f))
    assert (grades["no_kv_repeat"], grades["cost_model"], grades["decode"], grades["status"]) == \
        ("not measured", "not attempted", "fail", "graded")
    assert "| not measured |" in (tmp_path / "summary.md").read_text()

    results = report.gradescope(r, RUBRIC, "class")
    tests = {t["name"]: t for t in results["tests"]}
    assert tests[title["no_kv_repeat"]]["output"].startswith("not measured")
    assert tests[title["cost_model"]]["output"].startswith("not attempted")
    # The optional check left out because no figure could judge it is not measured, not "not attempted".
    assert f"Not measured, optional: {title['live_length']}" in results["output"]
    assert "Not attempted, optional" not in results["output"]


def test_a_report_not_graded_reads_not_graded_everywhere(tmp_path):
    from rich.console import Console

    r = report.ungraded("bob", 1, RUBRIC, "no kv_cache.py in the hand-back")
    summary.write([r], str(tmp_path))
    with open(tmp_path / "grades.csv", newline="") as f:
        assert next(csv.DictReader(f))["status"] == "not graded"
    with open(tmp_path / "summary.csv", newline="") as f:
        assert {row["title"] for row in csv.DictReader(f) if row["section"] == "status"} == \
            {"graded", "not graded", "grader error"}
    results = report.gradescope(r, RUBRIC, "class")
    assert {t["output"] for t in results["tests"]} == {"not graded"}
    markdown = report.markdown([r], RUBRIC)
    assert "| error |" not in markdown and "not measured" not in markdown
    console = Console(file=io.StringIO(), width=300, color_system=None)
    report.print_report(r, console, RUBRIC)
    assert "NOT GRADED" in console.file.getvalue() and r["status"] == "not_graded"


def test_the_gradescope_headline_is_one_sentence_that_says_each_thing_once():
    crits = {cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria}
    crits["no_kv_repeat"] = criteria_mod.Criterion("no_kv_repeat", "fail", "peak 3.9x the live K/V",
                                                   mistakes=["kv_repeat"])
    weak = grade_mod.build_report("a", grade_mod.Options(seed=1, rubric=RUBRIC), crits, {"kv_repeat": "peak"}, {},
                                  [], "namespaces", 0.0, None)
    capped = grade_mod.build_report("b", grade_mod.Options(seed=1, rubric=RUBRIC),
                                    {cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria},
                                    {}, {"kv_repeat": "peak"}, [], "namespaces", 0.0, None)
    for r in (weak, capped):
        label = RUBRIC.label(r["tier"], "class")
        headline = report.gradescope(r, RUBRIC, "class")["output"].splitlines()[0]
        assert headline.startswith(f"Result: {label}") and headline.count(label) == 1, headline
        assert headline.endswith(".") and not re.search(r"\. [a-z]", headline), headline  # one sentence
    assert "kv_repeat" in report.gradescope(weak, RUBRIC, "class")["output"].splitlines()[0]
    # The reason of a hand-back not graded, and of code that crashed, is said once.
    crashed = report.ungraded("c", 1, RUBRIC, "kv_cache.py: failed to import (SyntaxError: invalid syntax)")
    crashed.update(status="graded", tier="Weak", graded=True,
                   tier_reason="nothing could be measured: kv_cache.py: failed to import (SyntaxError: invalid syntax)")
    for r in (report.ungraded("d", 1, RUBRIC, BLANK), crashed):
        output = report.gradescope(r, RUBRIC, "class")["output"]
        said = r["error"]
        assert output.count(said) == 1, output
        from rich.console import Console

        console = Console(file=io.StringIO(), width=1000, color_system=None)
        report.print_report(r, console, RUBRIC, "class")
        assert console.file.getvalue().count(said) == 1, console.file.getvalue()


def test_a_blank_notebook_scores_0_wherever_grades_merge_and_stays_not_graded(tmp_path):
    from rich.console import Console

    blank = report.ungraded("blank.ipynb", 1, RUBRIC, BLANK)
    broken = report.ungraded("kit", 1, RUBRIC, "the sandbox did not start", "grader_error")
    summary.write([blank, broken], str(tmp_path))
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {row["submission"]: row for row in csv.DictReader(f)}
    assert float(rows["blank.ipynb"]["score"]) == 0 and rows["blank.ipynb"]["status"] == "not graded"
    assert rows["blank.ipynb"]["error"].endswith("fill in KVCache and gqa_attention, then hand it back")
    assert rows["kit"]["score"] == ""  # the kit failed: nothing to merge until it is graded again
    assert report.gradescope(blank, RUBRIC, "class")["score"] == 0
    assert blank["status"] == "not_graded" and blank["tier"] is None
    assert "then hand it back" in (tmp_path / "summary.md").read_text()
    console = Console(file=io.StringIO(), width=400, color_system=None)
    summary.print_summary([blank, broken], console, RUBRIC)
    row = next(line for line in console.file.getvalue().splitlines() if "blank.ipynb" in line)
    assert re.search(r"\b0\b", row) and "then hand it back" in console.file.getvalue(), row


# ------------------------------------------------------------------ one batch, end to end


def test_a_batch_with_a_hostile_folder_name_gains_nothing_beside_its_control(tmp_path):
    """Two copies of one example: ``alice`` and a folder named as a formula with a ``www.`` name and a
    bidi override. Both are graded alike; grades.csv, report.md and summary.md carry the name inert."""
    hostile = '=HYPERLINK("www.evil.example","100")\u202eeriH gnortS'
    example = os.path.join(ROOT, "catalogue", "examples", "chunk_local_mask")
    class_dir, out = tmp_path / "class", tmp_path / "out"
    for name in (CONTROL, hostile):
        shutil.copytree(example, class_dir / name)
    proc = subprocess.run([sys.executable, "-m", "grader", str(class_dir), "--jobs", "2", "--out", str(out),
                           "--markdown", str(out / "report.md"), "--trials", "20", "--seed", "5", "--timeout", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\u202e" not in proc.stdout and "\u202e" not in proc.stderr
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_name = {row["submission"]: row for row in rows}
    attack = next(row for name, row in by_name.items() if "HYPERLINK" in name)
    assert attack["submission"].startswith("'=HYPERLINK") and not unsafe_chars(attack["submission"])
    control = by_name[CONTROL]
    assert (attack["status"], attack["tier"], attack["score"]) == (control["status"], control["tier"],
                                                                   control["score"]) == \
        ("graded", "Weak", control["score"])
    for row in rows:
        assert all(not cell.lstrip().startswith(FORMULA) and not unsafe_chars(cell) for cell in row.values())
    for name in ("report.md", "summary.md"):
        check_github_markdown((out / name).read_text(encoding="utf-8"))
    saved = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert sorted(r["tier"] for r in saved) == ["Weak", "Weak"]
