"""``kvkit grade`` on the classroom notebook handed back (grader/stages/layout.py, docs/notebook.md).

A copy of notebooks/source/kv_cache/kv_cache.ipynb is split by its cells'
``kvkit`` role into the contract's files: implementation cells into
``kv_cache.py``, cost cells into ``cost.py``, the port into
``kv_cache_torch.py`` and the own check into a test file, so every section is
graded as it would be in a folder. Two gradings (each a few seconds), one module
fixture each: the solved notebook, and a student's copy with a chunk-local mask.
The rest reads the laid-out files only.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from grader.stages.grade import Options, grade
from grader.stages.layout import materialize

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks" / "source" / "kv_cache" / "kv_cache.ipynb"

# The planted mistake: the mask built from the chunk alone (top-left), decode skipping it.
CHUNK_LOCAL_MASK = '''
def visible_keys(lens, n_new, T: int, S: int) -> np.ndarray:
    """Which keys each query slot sees: bool `[B, T, S]`."""
    lens, n_new = np.asarray(lens), np.asarray(n_new)
    real = np.arange(T) < n_new[:, None]
    if T == 1:
        return (np.arange(S) < lens[:, None])[:, None, :] & real[:, :, None]
    return np.tril(np.ones((T, S), dtype=bool))[None] & (np.arange(S) < lens[:, None, None]) & real[:, :, None]
'''
SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION\n?", re.S | re.M)


def _grade_id(cell) -> str:
    return cell.metadata["nbgrader"]["grade_id"]


def _student_copy(answers: dict | None = None, stubs: bool = False):
    """The notebook as a student hands it back: no hidden tests, no solution markers; ``answers``
    rewrites answer cells by grade id; ``stubs`` leaves every other answer as nbgrader's stub."""
    nb = nbformat.read(SOURCE, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        if meta.get("grade"):
            cell.source = cell.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
        if meta.get("solution"):
            if _grade_id(cell) in (answers or {}):
                cell.source = answers[_grade_id(cell)].strip()
            elif stubs:
                cell.source = SOLUTION.sub(lambda m: f"{m[1]}# YOUR CODE HERE\n{m[1]}raise NotImplementedError()\n",
                                           cell.source)
            else:
                cell.source = "\n".join(line for line in cell.source.splitlines() if "### " not in line)
    return nb


def _written(nb, tmp_path, name: str):
    """``(the notebook written as tmp_path/name, an empty folder to lay it out in)``."""
    path, work = tmp_path / name, tmp_path / "work"
    nbformat.write(nb, str(path))
    work.mkdir()
    return path, work


# One fixture per grading, so that under ``pytest -n`` a worker grades only what its tests read.
@pytest.fixture(scope="module")
def solved_report():
    return grade(str(SOURCE), Options(seed=1, trials=30))


@pytest.fixture(scope="module")
def chunk_local_report(tmp_path_factory):
    alice = tmp_path_factory.mktemp("handback") / "alice.ipynb"
    nbformat.write(_student_copy({"visible_keys": CHUNK_LOCAL_MASK}), alice)
    return grade(str(alice), Options(seed=1, trials=30))


def test_the_solved_notebook_earns_the_tier_of_its_sections(solved_report):
    report = solved_report
    statuses = {c["id"]: c["status"] for c in report["criteria"]}
    evidence = {c["id"]: c["evidence"] for c in report["criteria"] if c["status"] != "pass"}
    assert report["status"] == "graded" and report["tier"] == "Strong Hire", (report["tier_reason"], evidence)
    # Graded from the cells that hold them, not "not_attempted" for want of a file.
    assert statuses["cost_model"] == statuses["own_tests"] == statuses["torch_port"] == "pass", statuses
    assert report["mistakes"] == [] and report["score"] == report["max_score"]
    # What nbgrader's cells and this grade do not share is said in the report too.
    assert any("live_length" in n and "nbgrader" in n for n in report["notes"]), report["notes"]


@pytest.mark.slow  # a second notebook grading with a port (make test-slow); the examples name the mask every run
def test_a_chunk_local_mask_is_weak_and_named(chunk_local_report):
    report = chunk_local_report
    assert report["tier"] == "Weak", report["tier_reason"]
    assert "chunk_local_mask" in report["numpy_mistakes"]
    assert "chunk_local_mask" in report["tier_reason"]


# ------------------------------------------------------------ the layout (no grading)


def test_the_notebook_is_split_by_role(tmp_path):
    files = materialize(str(SOURCE), str(tmp_path))
    assert files == ["cost.py", "kv_cache.py", "kv_cache_torch.py", "test_notebook_check.py"]
    text = {name: (tmp_path / name).read_text(encoding="utf-8") for name in files}
    for name, source in text.items():
        compile(source, name, "exec")  # syntax only: nothing of the submission runs here
        assert "HIDDEN TESTS" not in source and "matplotlib" not in source, name
    assert "class KVCache" in text["kv_cache.py"] and "def kv_bytes_per_token" not in text["kv_cache.py"]
    assert "def kv_bytes_per_token" in text["cost.py"] and "class KVCache" not in text["cost.py"]
    assert text["kv_cache_torch.py"].rstrip().endswith("KVCache = KVCacheTorch\ngqa_attention = gqa_attention_torch")
    assert "from kv_cache import *" in text["test_notebook_check.py"]
    assert "def test_check_against_reference" in text["test_notebook_check.py"]


def test_unattempted_sections_are_left_out(tmp_path):
    """A blank student copy hands back its stubbed implementation only: cost, port and own tests are not attempted."""
    path = tmp_path / "blank.ipynb"
    nbformat.write(_student_copy(stubs=True), path)
    work = tmp_path / "work"
    work.mkdir()
    assert materialize(str(path), str(work)) == ["kv_cache.py"]


def test_a_stub_nested_too_deep_to_print_is_read_as_written(tmp_path):
    """A blank copy whose cost stubs raise through 600 unary minuses: Python parses it, but printing it back
    exhausts the recursion limit. The stub check reads the syntax tree only, so the section counts as
    written (it is not nbgrader's stub) and the notebook is laid out, never a grader error."""
    nb = _student_copy(stubs=True)
    cost = next(c for c in nb.cells if c.metadata.get("kvkit", {}).get("role") == "cost")
    assert "raise NotImplementedError()" in cost.source
    cost.source = cost.source.replace("raise NotImplementedError()", "raise " + "-" * 600 + "NotImplementedError()")
    path, work = _written(nb, tmp_path, "deep.ipynb")
    assert materialize(str(path), str(work)) == ["cost.py", "kv_cache.py"]


def test_a_lone_surrogate_in_a_cell_is_laid_out_like_the_same_notebook_without_it(tmp_path):
    """JSON may escape a lone surrogate (\\ud800) that no UTF-8 file can hold: it is written as "?", never a
    grader error, and the hand-back's fingerprint (--resume) is taken all the same."""
    import json

    from grader.stages.layout import hand_back_sha256

    code = (ROOT / "catalogue" / "examples" / "hire_basic" / "kv_cache.py").read_text()
    for name, extra in (("control", ""), ("surrogate", "\nNOTE = '\ud800'  # a definition: kept\n")):
        cell = {"cell_type": "code", "metadata": {}, "source": code + extra, "outputs": [], "execution_count": None,
                "id": "a"}
        (tmp_path / f"{name}.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
        (tmp_path / f"work-{name}").mkdir()
        assert materialize(str(tmp_path / f"{name}.ipynb"), str(tmp_path / f"work-{name}")) == ["kv_cache.py"]
        assert hand_back_sha256(str(tmp_path / f"{name}.ipynb")) is not None
    assert (tmp_path / "work-surrogate" / "kv_cache.py").read_text().endswith("NOTE = '?'\n")


def test_a_notebook_without_roles_is_one_kv_cache(tmp_path):
    nb = _student_copy()
    for cell in nb.cells:
        cell.metadata.pop("kvkit", None)
    path, work = _written(nb, tmp_path, "own.ipynb")
    assert materialize(str(path), str(work)) == ["kv_cache.py"]
    source = (work / "kv_cache.py").read_text(encoding="utf-8")
    assert "def kv_bytes_per_token" in source and "class KVCacheTorch" in source


def test_a_kit_helper_the_own_tests_import_is_copied_in_but_not_graded(tmp_path):
    """catalogue.mutants ships with the starter bundle; the sandbox sees it only as a file of the submission."""
    import catalogue.mutants

    planting = ("from catalogue.mutants import plant\n\n\ndef test_my_check_catches_a_chunk_local_mask():\n"
                "    import pytest\n\n    with pytest.raises(AssertionError):\n"
                "        check_against_reference(*plant('chunk_local_mask', KVCache, gqa_attention))")
    nb = _student_copy()
    (run,) = [c for c in nb.cells if _grade_id(c) == "own_check_run"]
    run.source += "\n\n\n" + planting
    path, work = _written(nb, tmp_path, "bob.ipynb")
    files = materialize(str(path), str(work))
    assert "catalogue/mutants.py" not in files and "test_notebook_check.py" in files
    assert (work / "catalogue" / "mutants.py").read_bytes() == Path(catalogue.mutants.__file__).read_bytes()


def test_nbgraders_own_layout_is_read(tmp_path):
    """submitted/<student>/<assignment>/<notebook>.ipynb: the student's folder holds one notebook, one level down."""
    student = tmp_path / "submitted" / "alice"
    (student / "kv_cache").mkdir(parents=True)
    (student / "kv_cache" / "kv_cache.ipynb").write_bytes(SOURCE.read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    files = materialize(str(student), str(work))
    assert {"kv_cache.py", "cost.py", "kv_cache_torch.py"} <= set(files)


def test_a_cell_the_student_added_keeps_its_definitions(tmp_path):
    """A new cell (no role) defining a helper the implementation uses: its definitions go with the
    implementation; what it runs (a print, a plot) does not."""
    nb = nbformat.read(str(SOURCE), as_version=4)
    helper = nbformat.v4.new_code_cell("import math\n\nSCALE = 2\n\ndef my_helper(x):\n    return x * SCALE\n\n"
                                       "print(my_helper(3))\n")
    nb.cells.insert(3, helper)
    path, work = _written(nb, tmp_path, "student.ipynb")
    materialize(str(path), str(work))
    source = (work / "kv_cache.py").read_text()
    assert "def my_helper(x):" in source and "SCALE = 2" in source and "print(my_helper(3))" not in source
    compile(source, "kv_cache.py", "exec")


@pytest.mark.parametrize("bad_cell", [{"metadata": {}, "source": "# note", "id": "b"},  # no cell_type
                                      {"cell_type": "code", "metadata": {}, "source": 7, "outputs": [],
                                       "execution_count": None, "id": "b"}],  # a number for source
                         ids=["no cell_type", "source a number"])
def test_a_notebook_with_a_malformed_cell_is_not_graded_and_says_so(tmp_path, bad_cell):
    """nbformat only warns about such a notebook: it is the hand-back's problem (not graded, with the reason),
    never a grader error. Beside it, the same notebook without that cell is graded."""
    import json

    code = (ROOT / "catalogue" / "examples" / "hire_basic" / "kv_cache.py").read_text()
    good = {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None, "id": "a"}
    for name, cells in (("control", [good]), ("malformed", [good, bad_cell])):
        (tmp_path / f"{name}.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
    (tmp_path / "work").mkdir()
    assert materialize(str(tmp_path / "control.ipynb"), str(tmp_path / "work")) == ["kv_cache.py"]
    report = grade(str(tmp_path / "malformed.ipynb"), Options(seed=2, trials=5))
    assert report["status"] == "not_graded" and "not a readable notebook" in report["tier_reason"], report
    assert "cell 2" in report["tier_reason"]


@pytest.mark.parametrize("roles", [True, False], ids=["by role", "without roles"])
def test_a_cell_may_open_with_a_future_import(tmp_path, roles):
    """Jupyter compiles each cell on its own, so an implementation cell (after the setup cell) may open with
    ``from __future__ import annotations``; laid out after other cells it would be a SyntaxError (an
    attacker's honest control once got Weak 0 for it). The laid-out file opens with it instead."""
    nb = _student_copy()
    impl = next(c for c in nb.cells if c.metadata.get("kvkit", {}).get("role") == "implementation")
    impl.source = "from __future__ import annotations; import math\n\n" + impl.source
    if not roles:
        for cell in nb.cells:
            cell.metadata.pop("kvkit", None)
    path, work = _written(nb, tmp_path, "future.ipynb")
    materialize(str(path), str(work))
    source = (work / "kv_cache.py").read_text()
    compile(source, "kv_cache.py", "exec")  # the SyntaxError it was
    code = [line for line in source.splitlines() if line.strip() and not line.startswith("#")]
    assert code[0] == "from __future__ import annotations" and source.count("from __future__") == 1
    if roles:
        assert "pass; import math" in source  # the rest of its line stays where it was
    else:  # a notebook of its own is read statement by statement (its definitions): the import stands alone
        assert "\nimport math\n" in source


def test_a_long_cell_of_statements_costs_the_grader_linear_time(tmp_path):
    """A student cell of 20,000 one-line imports (228 KB): its definitions were each cut out of the whole
    cell again (ast.get_source_segment), quadratic time in the grader's own process (over 60 s, and a
    batch stalled); now a few tenths of a second. A loose bound: a containment check, not a benchmark."""
    import time

    nb = _student_copy()
    nb.cells.append(nbformat.v4.new_code_cell("import os\n" * 20_000))
    path = tmp_path / "long.ipynb"
    nbformat.write(nb, path)
    work = tmp_path / "work"
    work.mkdir()
    start = time.process_time()
    materialize(str(path), str(work))
    assert time.process_time() - start < 8.0
    assert (work / "kv_cache.py").read_text().count("import os") == 20_000


def test_a_notebook_of_more_code_than_a_file_may_hold_is_not_graded(tmp_path):
    nb = _student_copy()
    nb.cells += [nbformat.v4.new_code_cell("x = 1\n" * 100_000) for _ in range(2)]  # 1.2 MB of code
    path = tmp_path / "huge.ipynb"
    nbformat.write(nb, path)
    report = grade(str(path), Options(seed=1, trials=5))
    assert report["status"] == "not_graded" and "MiB of code" in report["error"], report["error"]
