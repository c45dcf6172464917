"""The figures README.md quotes about the learner's path and the classroom come from the code.

A count is checked against what it counts (the steps in exercises/steps.toml, the
notebook's graded cells); a timing names the command that measures it (``kvkit
bench --only progress``), which must exist, and stays within that command's target.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from benchmarks import bench
from kvkit import progress

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
WORDS = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def flat(text: str) -> str:
    return " ".join(text.split())


def section(title: str) -> str:
    """The README's section under the heading ``## {title}``, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, flags=re.S | re.M)
    assert match, f"README.md has no section '## {title}'"
    return flat(match[1])


def test_the_step_count_is_the_steps_tomls():
    match = re.search(r"and (\w+) step tests run in order", section("Learning: `kvkit progress`"))
    assert match, "the learner's section no longer says how many step tests there are"
    assert WORDS[match[1]] == len(progress.load_steps(ROOT / "exercises"))


def test_the_graded_requirement_count_is_the_notebooks():
    match = re.search(r"It autogrades (\d+) requirements", section("Classroom: the nbgrader notebook"))
    assert match, "the classroom section no longer says how many requirements the notebook grades"
    nb = nbformat.read(ROOT / "notebooks" / "source" / "kv_cache" / "kv_cache.ipynb", as_version=4)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert int(match[1]) == len(graded)


def test_the_progress_timings_name_the_command_that_measures_them_and_meet_its_target():
    text = section("Learning: `kvkit progress`")
    match = re.search(r"The first failing check came in ([\d.]+) s on step 1 and ([\d.]+) s on step 2 "
                      r"\(`kvkit bench --only progress`: the slowest of (\d+) runs, ([^)]+)\)", text)
    assert match, "the learner's section quotes no measured time to the first message, or not its command"
    assert "progress" in bench.FIGURES
    op, limit, _ = bench.TARGETS["progress_first_message_s"]
    assert op == "<=" and float(match[1]) <= limit and float(match[2]) <= limit, match[0]
    assert int(match[3]) == bench.settings(quick=False)["progress_rounds"]


def test_the_notebooks_total_is_its_graded_cells_points():
    match = re.search(r"a total of (\d+), the rubric's (\d+) less `live_length`", section("Classroom: the nbgrader notebook"))
    assert match, "the classroom section no longer says the notebook's total"
    nb = nbformat.read(ROOT / "notebooks" / "source" / "kv_cache" / "kv_cache.ipynb", as_version=4)
    points = sum(c.metadata["nbgrader"].get("points", 0) for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    from grader.stages import rubric

    from grader.stages.registry import REGISTRY

    r = rubric.load()
    assert round(points) == int(match[1]) and round(r.max_score) == int(match[2])
    ungraded = [cid for cid, spec in REGISTRY.items() if spec.not_in_notebook]  # live_length: no cell grades it
    assert round(r.max_score - sum(r.criteria[cid]["points"] for cid in ungraded)) == int(match[1])


def test_the_bundled_example_count_is_the_catalogues():
    match = re.search(r"the (\d+) bundled examples in", flat(README))
    assert match, "the performance table no longer says how many bundled examples it graded"
    import tomllib

    with open(ROOT / "catalogue" / "examples" / "expected.toml", "rb") as f:
        assert int(match[1]) == len(tomllib.load(f))
