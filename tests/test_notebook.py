"""The classroom notebook (docs/notebook.md), graded by the real nbgrader.

The grading test copies the nbgrader course (``notebooks/``) into a temporary
directory, runs ``nbgrader generate_assignment``, places submissions under
``submitted/<student>/kv_cache/``, runs ``nbgrader autograde`` and reads the
scores from nbgrader's gradebook (``nbgrader.api.Gradebook`` on the course's
``gradebook.db``), never from its log. The kernel is pinned to this
interpreter (a ``python3`` kernelspec on a temporary ``JUPYTER_PATH``), so the
hidden tests import the kit from the environment running the tests.

The grading is one test (one course, one ``generate_assignment``, one
``autograde`` of four submissions), so that ``pytest -n 2`` never runs two
kernels' worth of it on one worker while the other idles.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "notebooks"
ASSIGNMENT = NOTEBOOK = "kv_cache"
SOURCE = COURSE / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"

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


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebook", COURSE / "build_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILDER = _builder()
POINTS = BUILDER.POINTS


def _nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


# ------------------------------------------------------------ the committed notebook


def test_committed_notebook_is_what_the_build_script_writes():
    assert SOURCE.read_text(encoding="utf-8") == BUILDER.render(), \
        "notebooks/source/kv_cache/kv_cache.ipynb is stale: run .venv/bin/python notebooks/build_notebook.py"


def test_nbgrader_metadata():
    nb = nbformat.read(SOURCE, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    ids, graded, solutions = set(), {}, []
    for cell in nb.cells:
        meta = _nbgrader_meta(cell)
        assert meta.get("schema_version") == 3, f"cell {cell.id} has no nbgrader metadata of schema 3"
        assert meta["grade_id"] not in ids and meta["grade_id"] == cell.id
        ids.add(meta["grade_id"])
        if meta["grade"]:
            assert cell.cell_type == "code" and meta["locked"] and not meta["solution"]
            graded[meta["grade_id"]] = cell
        elif meta["solution"]:
            assert cell.cell_type == "code" and not meta["locked"]
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
            solutions.append(cell.id)
        else:
            assert meta["locked"], f"cell {cell.id} is neither an answer nor read-only"
    assert {g: _nbgrader_meta(c)["points"] for g, c in graded.items()} == POINTS
    for grade_id, cell in graded.items():
        assert "### BEGIN HIDDEN TESTS" in cell.source and "### END HIDDEN TESTS" in cell.source, grade_id
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1]
        assert "grader" in hidden or "solutions" in hidden, f"{grade_id}: hidden tests do not call the kit"
    for grade_id in ("test_chunked_prefill", "test_padding", "test_decode", "test_full_prefill", "test_head_mapping"):
        assert "from grader.checks import check" in graded[grade_id].source, grade_id
    assert {"cost", "kv_cache", "gqa_attention", "visible_keys", "softmax_visible", "torch_port",
            "own_check"} <= set(solutions)


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


def _submit(course_dir: Path, student: str, nb) -> None:
    folder = course_dir / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{NOTEBOOK}.ipynb")


def _replace_answer(grade_id: str, source: str):
    """The source notebook with answer cell ``grade_id`` rewritten."""
    nb = nbformat.read(SOURCE, as_version=4)
    (cell,) = [c for c in nb.cells if c.id == grade_id]
    assert _nbgrader_meta(cell)["solution"]
    cell.source = source.strip()
    return nb


def _scores(course_dir: Path, student: str) -> dict:
    """``{grade_id: (score, max_score)}`` for one submission, from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}", course_id="kvkit") as gb:
        submission = gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student)
        return {grade.name: (grade.score, grade.max_score) for grade in submission.grades}


def _errors(course_dir: Path, student: str) -> list:
    nb = nbformat.read(course_dir / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    return [(cell.id, out.get("ename"), out.get("evalue", "")[:200]) for cell in nb.cells
            if cell.cell_type == "code" for out in cell.outputs if out.output_type == "error"]


def test_nbgrader_generate_and_autograde(tmp_path):
    """generate_assignment, then one autograde of four submissions, scored from the gradebook."""
    course_dir = tmp_path / "course"
    course_dir.mkdir()
    shutil.copy(COURSE / "nbgrader_config.py", course_dir)
    shutil.copytree(COURSE / "source", course_dir / "source")
    env = _environment(tmp_path)
    _nbgrader(course_dir, env, "generate_assignment", ASSIGNMENT)

    # The student version: no solution, no hidden test, no output; a stub in every answer cell.
    release = nbformat.read(course_dir / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    text = "\n".join(cell.source for cell in release.cells)
    for leak in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "grader.checks", "from solutions",
                 "return 2 * layers * kv_heads"):
        assert leak not in text, f"the student version contains {leak!r}"
    stubs = [c.id for c in release.cells if "raise NotImplementedError()" in c.source]
    assert {"cost", "kv_cache", "group_queries", "visible_keys", "softmax_visible", "gqa_attention",
            "torch_port", "own_check"} <= set(stubs)
    assert all(not c.get("outputs") for c in release.cells if c.cell_type == "code")

    # One autograde run (nbgrader grades students one after the other) for the four submissions.
    _submit(course_dir, "solved", nbformat.read(SOURCE, as_version=4))
    _submit(course_dir, "blank", release)
    _submit(course_dir, "chunk_local", _replace_answer("visible_keys", CHUNK_LOCAL_MASK))
    _submit(course_dir, "nan_padding", _replace_answer("softmax_visible", NAN_PADDING))
    _nbgrader(course_dir, env, "autograde", ASSIGNMENT)

    full = {g: (float(p), float(p)) for g, p in POINTS.items()}
    solved = _scores(course_dir, "solved")
    assert solved == full, solved
    assert _errors(course_dir, "solved") == [], "the solved notebook must run top to bottom without an error"

    blank = _scores(course_dir, "blank")
    assert set(blank) == set(POINTS) and all(score == 0 for score, _ in blank.values()), blank
    failed = {cell for cell, _, _ in _errors(course_dir, "blank")}
    assert set(POINTS) <= failed, "every graded cell of the blank notebook must fail, not be skipped"

    assert _scores(course_dir, "chunk_local") == {**full, "test_chunked_prefill": (0.0, full["test_chunked_prefill"][1])}
    assert _scores(course_dir, "nan_padding") == {**full, "test_padding": (0.0, full["test_padding"][1])}

    # Feedback lands in feedback/<student>/<assignment>/<notebook>.html.
    _nbgrader(course_dir, env, "generate_feedback", ASSIGNMENT, "--student", "solved")
    feedback = course_dir / "feedback" / "solved" / ASSIGNMENT / f"{NOTEBOOK}.html"
    assert feedback.exists() and "test_chunked_prefill" in feedback.read_text(encoding="utf-8")
