"""The classroom notebook (docs/notebook.md): its text source, its metadata, and the real nbgrader.

The source is ``notebooks/kv_cache.pct.py``, a jupytext percent-format file with
nbgrader's metadata (and the kit's ``kvkit`` marker) in each cell header; the
``.ipynb`` nbgrader reads is made from it by jupytext. The fast tests read both
as data (that the pair is in sync is ``kvkit check-kit``'s): the answer cells hold the code of solutions/, every
graded cell names rubric criteria and is worth their points, the sections follow
exercises/steps.toml.

The grading test (marked ``slow``) copies the nbgrader course (``notebooks/``)
into a temporary directory, runs ``nbgrader generate_assignment``, places
submissions under ``submitted/<student>/kv_cache/``, runs ``nbgrader autograde``
and reads the scores from nbgrader's gradebook (``nbgrader.api.Gradebook`` on the
course's ``gradebook.db``), never from its log. The kernel is pinned to this
interpreter (a ``python3`` kernelspec on a temporary ``JUPYTER_PATH``), so the
hidden tests import the kit from the environment running the tests. It is one
test (one course, one ``generate_assignment``, one ``autograde`` of four
submissions), so that ``pytest -n 2`` never runs two kernels' worth of it on one
worker while the other idles.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from grader.stages.registry import REGISTRY
from grader.stages import rubric as rubric_mod

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "notebooks"
ASSIGNMENT = NOTEBOOK = "kv_cache"
SOURCE = COURSE / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
# What nbgrader releases beside the notebook (every other file of source/kv_cache/): the student's environment.
# The helpers are links to the kit's own files, so the released copies are never stale.
HELPERS = {"kv_helpers/mutants.py": ROOT / "catalogue" / "mutants.py", "kv_helpers/rules.py": ROOT / "catalogue" / "rules.py",
           "kv_helpers/opwatch.py": ROOT / "exercises" / "tests" / "opwatch.py"}
RELEASED = {f"{NOTEBOOK}.ipynb", "requirements.txt", "kv_helpers/__init__.py", *HELPERS}

# The file of solutions/ whose definitions each hand-back role's cells hold (own tests have none there).
SOLUTION_FILES = {"implementation": "kv_cache.py", "cost": "cost.py", "port": "kv_cache_torch.py"}
ROLES = {"setup", "implementation", "cost", "port", "own_tests"}
# The notebook's own-test functions: graded by the hidden tests on the kit's reference, not copies of solutions/.
OWN_CHECK = {"reference_attention", "check_against_reference", "test_check_against_reference"}
# Rubric criteria no notebook cell grades, and why.
# The criteria no cell grades, and why: the registry says (grader/stages/registry.py).
NOT_IN_NOTEBOOK = {cid: spec.not_in_notebook for cid, spec in REGISTRY.items() if spec.not_in_notebook}

# The two planted mistakes, each replacing one answer cell of the full solution.
CHUNK_LOCAL_MASK = '''
def visible_keys(lens, n_new, T, S):
    """Planted mistake: the mask is built from the chunk alone (top-left), and decode skips it."""
    lens, n_new = np.asarray(lens), np.asarray(n_new)
    real = np.arange(T) < n_new[:, None]
    if T == 1:
        return (np.arange(S) < lens[:, None])[:, None, :] & real[:, :, None]
    return np.tril(np.ones((T, S), dtype=bool))[None] & (np.arange(S) < lens[:, None, None]) & real[:, :, None]
'''
NAN_PADDING = '''
def softmax_visible(scores, visible):
    """Planted mistake: a plain softmax, NaN where no key is visible."""
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)
'''


def _nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def _grade_id(cell) -> str:
    return _nbgrader_meta(cell)["grade_id"]


def _kvkit(cell) -> dict:
    return cell.metadata.get("kvkit", {})


def _notebook():
    return nbformat.read(SOURCE, as_version=4)


def _graded(nb) -> dict:
    return {_grade_id(c): c for c in nb.cells if _nbgrader_meta(c).get("grade")}


# ------------------------------------------------------------ the text source and the .ipynb


# That the .ipynb is what jupytext makes of the text file is ``kvkit check-kit``'s (grader/batch/check_kit.py
# ``check_notebook``; tests/test_check_kit.py).


def test_the_source_folder_holds_only_the_notebook_and_the_students_environment():
    # nbgrader copies every other file of source/kv_cache/ into the student version (but what it ignores:
    # checkpoints, caches): the text, with its solutions and hidden tests, must live outside it, and only
    # the student's environment lies beside the notebook.
    files = {str(p.relative_to(SOURCE.parent)) for p in SOURCE.parent.rglob("*")
             if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
             and not any(part.startswith(".") for part in p.relative_to(SOURCE.parent).parts)}
    assert files == RELEASED, f"source/{ASSIGNMENT}/ would release {sorted(files - RELEASED)} to students"


def test_nbgrader_metadata():
    nb = _notebook()
    assert nb.metadata.kernelspec.name == "python3"
    ids, solutions = set(), []
    for cell in nb.cells:
        meta = _nbgrader_meta(cell)
        assert meta.get("schema_version") == 3, f"cell {cell.id} has no nbgrader metadata of schema 3"
        assert meta["grade_id"] not in ids, meta["grade_id"]
        ids.add(meta["grade_id"])
        if meta["grade"]:
            assert cell.cell_type == "code" and meta["locked"] and not meta["solution"]
        elif meta["solution"]:
            assert cell.cell_type == "code" and not meta["locked"]
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
            solutions.append(meta["grade_id"])
        else:
            assert meta["locked"], f"cell {meta['grade_id']} is neither an answer nor read-only"
    graded = _graded(nb)
    for grade_id, cell in graded.items():
        assert "### BEGIN HIDDEN TESTS" in cell.source and "### END HIDDEN TESTS" in cell.source, grade_id
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1]
        assert "grader" in hidden or "solutions" in hidden, f"{grade_id}: hidden tests do not call the kit"
    for grade_id in ("test_chunked_prefill", "test_padding", "test_decode", "test_full_prefill", "test_head_mapping"):
        assert "from grader.inprocess.checks import check" in graded[grade_id].source, grade_id
    from grader.inprocess.checks import NAMES

    called = {name for cell in graded.values() for name in re.findall(r'\bcheck\("(\w+)"', cell.source)}
    assert called and called <= set(NAMES), f"hidden tests call checks grader.inprocess.checks lacks: {called - set(NAMES)}"
    assert {"cost", "kv_cache", "group_queries", "visible_keys", "softmax_visible", "gqa_attention", "torch_port",
            "own_check"} <= set(solutions)


# ------------------------------------------------------------ the student's environment


def _visible_code(cell) -> str:
    """What a student's copy of a code cell runs: the hidden tests and the answers left out."""
    source = cell.source.split("### BEGIN HIDDEN TESTS")[0]
    return re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "raise NotImplementedError()", source, flags=re.S)


def _requirements() -> dict:
    lines = (SOURCE.parent / "requirements.txt").read_text().splitlines()
    return dict(line.split("==") for line in (x.strip() for x in lines) if line and not line.startswith("#"))


def test_every_import_of_the_visible_cells_comes_with_the_assignment():
    """The standard library, the packages of the released requirements.txt, or the helpers released beside
    the notebook: never the kit itself (grader, catalogue, solutions), which students do not get."""
    packages = {name.lower() for name in _requirements()}
    helpers = {"kv_helpers"} | {f"kv_helpers.{Path(rel).stem}" for rel in HELPERS}
    imported = set()
    for cell in _notebook().cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(_visible_code(cell))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
    assert {"kv_helpers.mutants", "kv_helpers.opwatch", "numpy", "torch"} <= imported, imported
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names
               and name.split(".")[0] not in packages and name not in helpers}
    assert not outside, f"visible cells import {sorted(outside)}, which do not come with the assignment"


def test_the_released_helpers_are_the_kits_files_and_hold_no_answer():
    for rel, original in HELPERS.items():
        released = SOURCE.parent / rel
        assert released.read_bytes() == original.read_bytes(), f"{rel} is not {original.relative_to(ROOT)}"
        text = released.read_text()
        assert "import grader" not in text and "from solutions" not in text and "import solutions" not in text


def test_the_student_requirements_pin_what_the_kit_pins():
    pinned = dict(re.match(r"([A-Za-z0-9_.-]+)==([^\s;]+)", dep).groups()
                  for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                  if "==" in dep)
    wanted = _requirements()
    assert {"numpy", "matplotlib", "torch", "ipykernel"} <= set(wanted), wanted
    for name, version in wanted.items():
        if name in pinned:
            assert version == pinned[name], f"requirements.txt pins {name}=={version}, the kit {pinned[name]}"


# ------------------------------------------------------------ points from the rubric


def test_each_graded_cell_names_rubric_criteria_and_is_worth_their_points():
    rubric = rubric_mod.load()
    named = {}
    for grade_id, cell in _graded(_notebook()).items():
        criteria = _kvkit(cell).get("criteria")
        assert criteria and all(c in rubric.criteria for c in criteria), \
            f"{grade_id} must name criteria of grader/rubric.toml in its kvkit metadata, got {criteria!r}"
        # One criterion per cell: a mistake loses exactly that criterion's points, as in kvkit grade (a cell
        # of two would lose both: nbgrader scores a cell all or nothing).
        assert len(criteria) == 1, f"{grade_id} grades {criteria}: one criterion per graded cell"
        for cid in criteria:
            assert cid not in named, f"{cid} is graded by both {named[cid]} and {grade_id}"
            named[cid] = grade_id
        want = sum(rubric.criteria[c]["points"] for c in criteria)
        assert _nbgrader_meta(cell)["points"] == want, \
            f"{grade_id} is worth {_nbgrader_meta(cell)['points']} points; its criteria {criteria} are worth {want}"
    assert set(rubric.criteria) - set(named) == set(NOT_IN_NOTEBOOK)


def test_the_points_add_up_to_what_the_rubric_implies():
    rubric = rubric_mod.load()
    total = sum(_nbgrader_meta(c)["points"] for c in _graded(_notebook()).values())
    assert total == rubric.max_score - sum(rubric.criteria[c]["points"] for c in NOT_IN_NOTEBOOK)


def test_the_table_at_the_top_names_each_graded_cells_criteria():
    nb = _notebook()
    (table,) = [c.source for c in nb.cells if _grade_id(c) == "points"]
    rows = {m[0]: m[1] for m in re.findall(r"^\| .* \| `(test_\w+)` \| (.*) \|$", table, flags=re.M)}
    graded = _graded(nb)
    assert list(rows) == list(graded), "one row per graded cell, in notebook order"
    for grade_id, cell in graded.items():
        assert rows[grade_id] == ", ".join(f"`{c}`" for c in _kvkit(cell)["criteria"]), grade_id
    assert not re.search(r"\bpoints? \|", table), "the points are the rubric's: the table names criteria only"


# ------------------------------------------------------------ the learner's path


def test_sections_follow_the_steps_in_order():
    steps = [s["number"] for s in tomllib.loads((ROOT / "exercises" / "steps.toml").read_text())["step"]]
    sections = [(c.source.splitlines()[0], _kvkit(c)["step"]) for c in _notebook().cells
                if c.cell_type == "markdown" and "step" in _kvkit(c)]
    assert all(title.startswith("## ") for title, _ in sections), sections
    order = [steps.index(step) for _, step in sections]
    assert order == sorted(order), f"sections out of steps.toml's order: {sections}"
    assert sorted(set(order)) == list(range(len(steps))), "every step has a section"
    numbers = [int(re.match(r"## (\d+)\.", title).group(1)) for title, _ in sections]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


# ------------------------------------------------------------ the answers are solutions/


class _Normalise(ast.NodeTransformer):
    """Docstrings dropped (the notebook keeps its own, for the learner); names mapped to solutions/."""

    def __init__(self, rename: dict):
        self.rename = rename

    def _body(self, node):
        self.generic_visit(node)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_FunctionDef(self, node):
        node.name = self.rename.get(node.name, node.name)
        return self._body(node)

    def visit_ClassDef(self, node):
        node.name = self.rename.get(node.name, node.name)
        return self._body(node)

    def visit_Name(self, node):
        node.id = self.rename.get(node.id, node.id)
        return node


def _definitions(source: str, rename: dict | None = None) -> dict:
    """``{name: ast.dump}`` of the top-level functions and classes of ``source``, normalised."""
    tree = _Normalise(rename or {}).visit(ast.parse(source))
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _port_names(source: str) -> dict:
    """The port cell's names mapped to the module's: ``visible_keys_torch`` -> ``visible_keys``, ``KVCacheTorch`` -> ``KVCache``."""
    names = [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return {n: re.sub(r"(_torch|Torch)$", "", n) for n in names}


def test_answer_cells_hold_the_code_of_solutions():
    """Each hand-back role's definitions are solutions/' own, function for function (docstrings aside)."""
    nb = _notebook()
    by_role: dict = {}
    for cell in nb.cells:
        role = _kvkit(cell).get("role")
        if cell.cell_type == "code" and role is not None:
            assert role in ROLES, f"{_grade_id(cell)}: unknown role {role!r}"
            by_role.setdefault(role, []).append(cell)
    for cell in nb.cells:
        meta = _nbgrader_meta(cell)
        if meta.get("solution"):
            assert _kvkit(cell).get("role") in ROLES - {"setup"}, f"answer cell {meta['grade_id']} has no hand-back role"
        if meta.get("grade"):
            assert "role" not in _kvkit(cell), f"graded cell {meta['grade_id']} is not handed back"
    for role, name in SOLUTION_FILES.items():
        source = "\n\n".join(c.source for c in by_role[role])
        rename = _port_names(source) if role == "port" else {}
        mine = _definitions(source, rename)
        theirs = _definitions((ROOT / "solutions" / name).read_text(encoding="utf-8"))
        assert set(mine) == set(theirs), f"{role} cells define {sorted(mine)}, solutions/{name} {sorted(theirs)}"
        for fn in theirs:
            assert mine[fn] == theirs[fn], f"{fn} in the notebook's {role} cells differs from solutions/{name}"
    own = _definitions("\n\n".join(c.source for c in by_role["own_tests"]))
    assert set(own) == OWN_CHECK


def test_the_port_cell_exports_the_contracts_names():
    (port,) = [c for c in _notebook().cells if _grade_id(c) == "torch_port"]
    defined = set(_port_names(port.source))
    exports = _kvkit(port)["exports"]
    assert set(exports) == {"KVCache", "gqa_attention"} and set(exports.values()) <= defined


# ------------------------------------------------------------ real nbgrader


def _environment(tmp: Path) -> dict:
    """nbgrader from this interpreter's environment, with a python3 kernel that is this interpreter."""
    kernel = tmp / "jupyter" / "kernels" / "python3"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    env = dict(os.environ)
    # nbgrader runs `alembic` (its database migrations) from PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["JUPYTER_PATH"] = str(tmp / "jupyter")
    # Nothing from the user's home: config, kernels, runtime files, IPython profile.
    for name, folder in (("JUPYTER_CONFIG_DIR", "jupyter-config"), ("JUPYTER_DATA_DIR", "jupyter-data"),
                         ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"), ("IPYTHONDIR", "ipython")):
        (tmp / folder).mkdir()
        env[name] = str(tmp / folder)
    env.pop("MPLBACKEND", None)  # the kernel's own inline backend, as an instructor gets it
    return env


def _nbgrader(course: Path, env: dict, *args: str) -> str:
    exe = Path(sys.executable).parent / "nbgrader"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nbgrader"]
    proc = subprocess.run(cmd + list(args), cwd=course, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{log[-4000:]}"
    return log


def generated_course(tmp: Path) -> tuple[Path, dict]:
    """``(course folder, environment)``: a copy of the course in ``tmp`` with the student version made by
    ``nbgrader generate_assignment`` (links to the kit's helpers followed)."""
    course = tmp / "course"
    course.mkdir()
    shutil.copy(COURSE / "nbgrader_config.py", course)
    shutil.copytree(COURSE / "source", course / "source")
    env = _environment(tmp)
    _nbgrader(course, env, "generate_assignment", ASSIGNMENT)
    return course, env


def _submit(course_dir: Path, student: str, nb) -> None:
    folder = course_dir / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{NOTEBOOK}.ipynb")


def _replace_answer(grade_id: str, source: str):
    """The source notebook with answer cell ``grade_id`` rewritten."""
    nb = _notebook()
    (cell,) = [c for c in nb.cells if _grade_id(c) == grade_id]
    assert _nbgrader_meta(cell)["solution"]
    cell.source = source.strip()
    return nb


def _repeating_attention() -> str:
    """The notebook's own gqa_attention, with K and V copied out to the G query heads of each group."""
    (cell,) = [c for c in _notebook().cells if _grade_id(c) == "gqa_attention"]
    source = re.sub(r"\s*### (BEGIN|END) SOLUTION", "", cell.source)
    views = ("    k = cache.k[:, :, None, :S]\n    v = cache.v[:, :, None, :S]\n")
    assert views in source
    return source.replace(views, "    k = np.repeat(cache.k[:, :, None, :S], qg.shape[2], axis=2)\n"
                                 "    v = np.repeat(cache.v[:, :, None, :S], qg.shape[2], axis=2)\n")


def _scores(course_dir: Path, student: str) -> dict:
    """``{grade_id: (score, max_score)}`` for one submission, from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}", course_id="kvkit") as gb:
        submission = gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student)
        return {grade.name: (grade.score, grade.max_score) for grade in submission.grades}


def _errors(course_dir: Path, student: str) -> list:
    nb = nbformat.read(course_dir / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    return [(_grade_id(cell), out.get("ename"), out.get("evalue", "")[:200]) for cell in nb.cells
            if cell.cell_type == "code" for out in cell.outputs if out.output_type == "error"]


@pytest.mark.slow
def test_nbgrader_generate_and_autograde(tmp_path):
    """generate_assignment, then one autograde of five submissions, scored from the gradebook."""
    course_dir, env = generated_course(tmp_path)

    # The student version: no solution, no hidden test, no output; a stub in every answer cell; the
    # hand-back roles kept (kvkit grade splits a handed-in copy by them).
    release = nbformat.read(course_dir / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    text = "\n".join(cell.source for cell in release.cells)
    for leak in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "grader.inprocess.checks", "from solutions",
                 "return 2 * layers * kv_heads"):
        assert leak not in text, f"the student version contains {leak!r}"
    stubs = [_grade_id(c) for c in release.cells if "raise NotImplementedError()" in c.source]
    assert {"cost", "kv_cache", "group_queries", "visible_keys", "softmax_visible", "gqa_attention",
            "torch_port", "own_check"} <= set(stubs)
    assert all(not c.get("outputs") for c in release.cells if c.cell_type == "code")
    source_markers = {_grade_id(c): _kvkit(c) for c in _notebook().cells}
    assert {_grade_id(c): _kvkit(c) for c in release.cells} == source_markers
    released = course_dir / "release" / ASSIGNMENT
    assert {str(p.relative_to(released)) for p in released.rglob("*") if p.is_file()} == RELEASED
    for rel, original in HELPERS.items():  # copies, not links
        assert not (released / rel).is_symlink() and (released / rel).read_bytes() == original.read_bytes(), rel

    # One autograde run (nbgrader grades students one after the other) for the five submissions.
    _submit(course_dir, "solved", _notebook())
    _submit(course_dir, "blank", release)
    _submit(course_dir, "chunk_local", _replace_answer("visible_keys", CHUNK_LOCAL_MASK))
    _submit(course_dir, "nan_padding", _replace_answer("softmax_visible", NAN_PADDING))
    _submit(course_dir, "kv_repeat", _replace_answer("gqa_attention", _repeating_attention()))
    _nbgrader(course_dir, env, "autograde", ASSIGNMENT)

    points = {g: float(_nbgrader_meta(c)["points"]) for g, c in _graded(_notebook()).items()}
    full = {g: (p, p) for g, p in points.items()}
    solved = _scores(course_dir, "solved")
    assert solved == full, solved
    assert _errors(course_dir, "solved") == [], "the solved notebook must run top to bottom without an error"

    blank = _scores(course_dir, "blank")
    assert set(blank) == set(points) and all(score == 0 for score, _ in blank.values()), blank
    failed = {cell for cell, _, _ in _errors(course_dir, "blank")}
    assert set(points) <= failed, "every graded cell of the blank notebook must fail, not be skipped"

    # Chunked prefill, and the ragged rows judged on every ragged step as kvkit grade judges them.
    assert _scores(course_dir, "chunk_local") == {**full, "test_chunked_prefill": (0.0, full["test_chunked_prefill"][1]),
                                                  "test_ragged_rows": (0.0, full["test_ragged_rows"][1])}
    assert _scores(course_dir, "nan_padding") == {**full, "test_padding": (0.0, full["test_padding"][1])}
    # A repeat loses the repeat's points alone, as kvkit grade fails no_kv_repeat alone.
    assert _scores(course_dir, "kv_repeat") == {**full, "test_no_kv_repeat": (0.0, full["test_no_kv_repeat"][1])}

    # Feedback lands in feedback/<student>/<assignment>/<notebook>.html.
    _nbgrader(course_dir, env, "generate_feedback", ASSIGNMENT, "--student", "solved")
    feedback = course_dir / "feedback" / "solved" / ASSIGNMENT / f"{NOTEBOOK}.html"
    assert feedback.exists() and "test_chunked_prefill" in feedback.read_text(encoding="utf-8")
