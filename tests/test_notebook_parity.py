"""One grade per student: nbgrader's cells and ``kvkit grade`` award the same points per criterion.

An instructor may grade a student's notebook two ways: with nbgrader (the notebook's autograded cells, points
per cell) and with ``kvkit grade STUDENT.ipynb --audience class`` (points per rubric criterion). Here six
hand-backs are graded both ways and compared criterion by criterion (docs/notebook.md, "One grade, two
graders"). Each is what a student hands in: the student version nbgrader releases, its answer cells filled
with the notebook's own answers (the code of solutions/, as tests/test_notebook.py checks) or a variant:

* ``right``: every answer;
* ``kv_repeat``: ``gqa_attention`` copies K and V out to every query head (``np.repeat``);
* ``chunk_local``: ``visible_keys`` aligns a chunk's mask to the top left (decode skips the mask);
* ``refuses_chunks``: ``KVCache.append`` refuses a chunk after cached tokens with a clear NotImplementedError;
* ``blank``: the student version as released, nothing filled in;
* ``kv_repeat_no_port``: the repeat, and the PyTorch port left as released (an optional section not attempted).

nbgrader runs as an instructor runs it (``generate_assignment``, then one ``autograde`` of the six, the
scores read from its gradebook), and ``kvkit grade`` as its command line, on the same six files at the same
time (each takes a core). A graded cell maps to its criterion through one table, the ``criteria`` each graded
cell names in its ``kvkit`` metadata (tests/test_notebook.py checks that each names one rubric criterion and
is worth its points). Points are compared before ``kvkit grade`` scales them. An optional section not
attempted counts neither for nor against in both: ``kvkit grade`` leaves it out of its total (and scales the
rest up), and nbgrader, whose total is fixed, gives its cell the student's share of its points, the fraction
earned on the other cells (notebooks/nbgrader_config.py).

What the two may not share is listed here, each a design choice that docs/notebook.md's table of
differences gives with its reason: ``KVKIT_ONLY`` (no cell grades it) and ``DIFFERENCES`` (the points each
side awards, where they differ by design). Anything else that differs fails the test. Marked slow (a minute
to two on two cores): ``make test-slow``; the check that each difference is documented is fast.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader.stages.registry import REGISTRY
from grader.stages import rubric as rubric_mod
from test_notebook import ASSIGNMENT, COURSE, NOTEBOOK, _nbgrader, generated_course

ROOT = Path(__file__).resolve().parents[1]
SOURCE = COURSE / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
DOCS = ROOT / "docs" / "notebook.md"
SEED, TRIALS = 1, 30  # kvkit grade's hidden trials: the criteria compared do not depend on their count

# Rubric criteria no graded cell grades: only kvkit grade awards their points.
KVKIT_ONLY = {cid for cid, spec in REGISTRY.items() if spec.not_in_notebook}  # no cell grades them
# Points that differ by design, as (nbgrader's, kvkit grade's): the own tests. nbgrader grades the learner's
# check against the kit's reference, so a mistake in the code costs only its own cells; kvkit grade runs the
# check on the student's code first, and a check that fails there (rightly, on a chunk-local mask; or because
# the code refuses the chunks it feeds) earns nothing.
DIFFERENCES = {("chunk_local", "own_tests"): (7.0, 0.0), ("refuses_chunks", "own_tests"): (7.0, 0.0)}
# The criteria each hand-back loses in both graders (besides DIFFERENCES): what the issue asks of each mistake.
LOST = {
    "right": set(),
    "kv_repeat": {"no_kv_repeat"},  # the repeat's points alone
    "chunk_local": {"chunked_prefill", "ragged_rows"},  # kvkit grade's ragged trials hold chunks after cached tokens
    "refuses_chunks": {"chunked_prefill"},  # a clear refusal is charged once, to chunked prefill
    "blank": "all",
    "kv_repeat_no_port": {"no_kv_repeat"},  # the port, not attempted, is not lost: it is left out
}
# The optional sections each hand-back did not attempt: kvkit grade leaves them out, nbgrader gives the share.
LEFT_OUT = {"kv_repeat_no_port": {"torch_port"}}

# ------------------------------------------------------------ the hand-backs

# The planted mistakes, each an answer cell of the student's (the notebook's answer, changed).
CHUNK_LOCAL_VISIBLE_KEYS = '''
def visible_keys(lens, n_new, T: int, S: int) -> np.ndarray:
    """Which keys each query slot sees: bool `[B, T, S]` (the mask of the chunk alone, aligned top left)."""
    lens, n_new = np.asarray(lens), np.asarray(n_new)
    real = np.arange(T) < n_new[:, None]
    if T == 1:  # decode: every key of the row
        return (np.arange(S) < lens[:, None])[:, None, :] & real[:, :, None]
    return np.tril(np.ones((T, S), dtype=bool))[None] & (np.arange(S) < lens[:, None, None]) & real[:, :, None]
'''
VIEWS = "    k = cache.k[:, :, None, :S]\n    v = cache.v[:, :, None, :S]\n"
REPEATS = ("    k = np.repeat(cache.k[:, :, None, :S], qg.shape[2], axis=2)  # a copy of K per query head\n"
           "    v = np.repeat(cache.v[:, :, None, :S], qg.shape[2], axis=2)\n")
BEFORE_WRITES = "        # Every row fits, so no write below can fail half-way through the batch.\n"
REFUSAL = ("        if ((self.lens > 0) & (n_new > 1)).any():\n"
           "            raise NotImplementedError(\"chunked prefill (a chunk appended to a row that holds tokens \"\n"
           "                                      \"already) is not supported: prefill into an empty row, then decode\")\n")


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def _answers() -> dict:
    """``{grade_id: source}`` of the source notebook's answer cells, the solution markers taken out."""
    nb = nbformat.read(SOURCE, as_version=4)
    return {_meta(c)["grade_id"]: re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", c.source, flags=re.M)
            for c in nb.cells if _meta(c).get("solution")}


def _changed(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"the notebook's answer no longer holds {old!r}: update this test's variant"
    return source.replace(old, new)


def _hand_backs(release) -> dict:
    """``{student: notebook}``: the released student version, its answer cells filled in per student (an
    answer given as None is left as released)."""
    answers = _answers()
    variants = {
        "right": {},
        "kv_repeat": {"gqa_attention": _changed(answers["gqa_attention"], VIEWS, REPEATS)},
        "chunk_local": {"visible_keys": CHUNK_LOCAL_VISIBLE_KEYS.strip() + "\n"},
        "refuses_chunks": {"kv_cache": _changed(answers["kv_cache"], BEFORE_WRITES, REFUSAL + BEFORE_WRITES)},
        "blank": None,
        "kv_repeat_no_port": {"gqa_attention": _changed(answers["gqa_attention"], VIEWS, REPEATS), "torch_port": None},
    }
    out = {}
    for student, changed in variants.items():
        nb = nbformat.from_dict(json.loads(json.dumps(release)))  # a deep copy
        for cell in nb.cells:
            grade_id = _meta(cell).get("grade_id")
            if changed is None or not _meta(cell).get("solution"):
                continue
            answer = changed.get(grade_id, answers[grade_id])
            if answer is not None:
                cell.source = answer
        out[student] = nb
    return out


# ------------------------------------------------------------ the two grades


def cell_criteria() -> dict:
    """``{grade_id: criterion}``: the one table from nbgrader's cells to the rubric's criteria, the ``criteria``
    of each graded cell's ``kvkit`` metadata (one per cell)."""
    nb = nbformat.read(SOURCE, as_version=4)
    table = {}
    for cell in nb.cells:
        if _meta(cell).get("grade"):
            (criterion,) = cell.metadata["kvkit"]["criteria"]
            table[_meta(cell)["grade_id"]] = criterion
    return table


def _nbgrader_points(course: Path, student: str) -> dict:
    """``{criterion: points}`` nbgrader awarded ``student``, from its gradebook."""
    from nbgrader.api import Gradebook

    criteria = cell_criteria()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="kvkit") as gb:
        submission = gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student)
        return {criteria[grade.name]: float(grade.score) for grade in submission.grades}


def _kvkit_points(report: dict, rubric) -> dict:
    """``{criterion: points}`` of a ``kvkit grade`` report, before scaling (a criterion's share of its scaled
    maximum, times its rubric points); None for a criterion left out of the total (counted neither for nor
    against)."""
    points = {}
    for c in report["criteria"]:
        full = float(rubric.criteria[c["id"]]["points"])
        points[c["id"]] = round(c["points"] / c["max_points"] * full, 2) if c["max_points"] else None
    return points


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """``{student: {"nbgrader": points, "kvkit": points, "report": report}}`` for the hand-backs."""
    tmp = tmp_path_factory.mktemp("parity")
    course, env = generated_course(tmp)
    release = nbformat.read(course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    hand_backs = _hand_backs(release)
    files = tmp / "hand-backs"
    files.mkdir()
    for student, nb in hand_backs.items():
        nbformat.write(nb, files / f"{student}.ipynb")
        (course / "submitted" / student / ASSIGNMENT).mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")

    # kvkit grade on one core while nbgrader autogrades on the other.
    reports_file, log = tmp / "reports.json", tmp / "kvkit.log"
    with open(log, "w") as out:
        kvkit = subprocess.Popen([sys.executable, "-m", "grader", *(str(files / f"{s}.ipynb") for s in hand_backs),
                                  "--audience", "class", "--seed", str(SEED), "--trials", str(TRIALS), "--quiet",
                                  "--json", str(reports_file)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            _nbgrader(course, env, "autograde", ASSIGNMENT)
            assert kvkit.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            if kvkit.poll() is None:
                kvkit.kill()
                kvkit.wait()
    rubric = rubric_mod.load()
    reports = {Path(r["submission"]).stem: r for r in json.loads(reports_file.read_text())}
    assert set(reports) == set(hand_backs), sorted(reports)
    return {student: {"nbgrader": _nbgrader_points(course, student), "kvkit": _kvkit_points(reports[student], rubric),
                      "report": reports[student]}
            for student in hand_backs}


def table(graded: dict) -> str:
    """The points per criterion, both ways, as a Markdown table (nbgrader / kvkit grade per hand-back)."""
    criteria = list(rubric_mod.load().criteria)
    students = list(graded)
    show = lambda p: "-" if p is None else f"{p:g}"  # noqa: E731
    lines = ["| criterion | " + " | ".join(students) + " |", "| --- |" + " --- |" * len(students)]
    for cid in criteria:
        cells = [f"{show(graded[s]['nbgrader'].get(cid))} / {show(graded[s]['kvkit'].get(cid))}" for s in students]
        lines.append(f"| `{cid}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------ the comparison


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-parity")
def test_each_criterion_gets_the_same_points_both_ways(graded):
    """Per criterion, nbgrader's cell and kvkit grade award the same points, but for what is listed above."""
    rubric = rubric_mod.load()
    assert set(cell_criteria().values()) == set(rubric.criteria) - KVKIT_ONLY
    differ = []
    for student, grades in graded.items():
        nbgrader, kvkit = grades["nbgrader"], grades["kvkit"]
        assert KVKIT_ONLY.isdisjoint(nbgrader)
        left_out = {cid for cid, p in kvkit.items() if p is None}
        assert left_out == LEFT_OUT.get(student, set()), (student, left_out)
        for cid in set(rubric.criteria) - KVKIT_ONLY:
            got = (nbgrader[cid], kvkit[cid])
            if cid in left_out:  # neither for nor against: nbgrader's cell is worth the share of the rest
                want = (share(nbgrader, left_out, rubric.criteria[cid]["points"], rubric), None)
            else:
                want = DIFFERENCES.get((student, cid), (got[0], got[0]))
            if got != want:
                differ.append(f"{student}, {cid}: nbgrader {got[0]}, kvkit grade {got[1]}, expected {want}")
    assert not differ, "points differ:\n" + "\n".join(differ) + "\n\n" + table(graded)


def share(nbgrader: dict, left_out: set, points: float, rubric) -> float:
    """``points`` times the fraction the student earned in nbgrader's other cells (those not ``left_out``),
    to the hundredth."""
    counted = set(nbgrader) - left_out
    return round(points * sum(nbgrader[c] for c in counted) / sum(rubric.criteria[c]["points"] for c in counted), 2)


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-parity")
def test_each_mistake_costs_its_own_criteria(graded):
    """What each hand-back loses, in nbgrader and in kvkit grade alike (DIFFERENCES aside)."""
    rubric = rubric_mod.load()
    for student, grades in graded.items():
        for side in ("nbgrader", "kvkit"):
            points = grades[side]
            lost = {cid for cid, p in points.items() if cid not in LEFT_OUT.get(student, set())
                    and p < rubric.criteria[cid]["points"] and (student, cid) not in DIFFERENCES}
            want = set(points) if LOST[student] == "all" else LOST[student]
            assert lost == want, f"{student} loses {sorted(lost)} in {side}, not {sorted(want)}\n\n{table(graded)}"
    assert graded["blank"]["report"]["status"] == "not_graded"  # nothing of the student's to grade: 0 merged
    assert graded["right"]["report"]["tier"] == "Strong Hire"


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-parity")
def test_the_report_of_a_notebook_says_what_no_cell_grades(graded):
    """live_length's absence from the notebook is explained in every kvkit grade report of a notebook (and in
    docs/notebook.md: test_every_difference_is_a_documented_design_choice)."""
    for student, grades in graded.items():
        if grades["report"]["status"] == "graded":
            notes = grades["report"]["notes"]
            for cid in KVKIT_ONLY:
                assert any(cid in n and "nbgrader" in n for n in notes), (student, notes)


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-parity")
def test_the_report_of_a_notebook_says_how_its_own_tests_are_judged(graded):
    notes = graded["chunk_local"]["report"]["notes"]
    for cid in {cid for _, cid in DIFFERENCES}:
        assert any(cid in n and "nbgrader" in n for n in notes), notes
    assert not any("gives its cell 0" in n for n in notes), notes  # a port not attempted: the share, since


def _documented_differences() -> dict:
    """``{criterion: reason}``: the rows of docs/notebook.md's table of differences."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### What differs, and why", 1)[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `(\w+)` \| (.+?) \|", section, flags=re.M))


def test_every_difference_is_a_documented_design_choice():
    """Each criterion judged differently has its row, with its reason, in docs/notebook.md; each criterion no
    cell grades has its reason in the registry, which the note of every notebook report quotes."""
    from grader.stages.grade import NOTEBOOK_NOTE

    documented = _documented_differences()
    judged_otherwise = {cid for _, cid in DIFFERENCES}
    assert judged_otherwise <= set(documented), \
        f"docs/notebook.md does not give {sorted(judged_otherwise - set(documented))}"
    assert set(rubric_mod.load().criteria) >= set(documented)
    for cid in KVKIT_ONLY:
        assert REGISTRY[cid].not_in_notebook and f"{cid} ({REGISTRY[cid].not_in_notebook})" in NOTEBOOK_NOTE
