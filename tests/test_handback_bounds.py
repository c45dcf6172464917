"""How a hand-back is laid out and refused (grader/stages/layout.py; issues 22 and 21).

- Bounds on what a hand-back holds: files and folders counted before anything is copied (a folder, a
  zip); a sandbox that cannot hold the hand-back is the hand-back's doing, never ``grader_error``.
- Notebook cell magics: ``%%time``-like cells keep their body, ``%%writefile NAME`` lays out that
  file (a plain name only), other cell magics are dropped with a note.
- A candidate's own notebook (no role markers) is its definitions; its top-level statements are
  exploration, left out and listed in a note.
- A module the grading environment lacks gives ``not_graded``, naming it and what to do.

One module fixture grades the attacks beside their controls through ``kvkit grade`` (three full
gradings: the rest are refused at once); everything else reads laid-out files or calls the
functions directly.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader.stages import layout as submission
from grader.sandbox import launch
from grader.stages.layout import SubmissionError, materialize, missing_module, sandbox_refusal

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "catalogue" / "examples"
EMPTY_FILES = 20_000  # what filled the sandbox working folder's inodes (launch.WORKDIR_INODES)


def _kv_repeat_zip(path: Path, padding: int = 0) -> Path:
    """``catalogue/examples/kv_repeat`` zipped in a top folder, with ``padding`` empty .py files beside it."""
    with zipfile.ZipFile(path, "w") as archive:
        for name in sorted(os.listdir(EXAMPLES / "kv_repeat")):
            archive.write(EXAMPLES / "kv_repeat" / name, f"work/{name}")
        for i in range(padding):
            archive.writestr(f"work/pad/e{i}.py", "")
    return path


def _notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, str(path))
    return path


def _laid_out(path: Path, tmp_path: Path, notes: list | None = None) -> dict[str, str]:
    """``{file: text}`` of the hand-back at ``path`` as laid out."""
    work = tmp_path / f"work-{path.name}"
    work.mkdir()
    return {rel: (work / rel).read_text(encoding="utf-8") for rel in materialize(str(path), str(work), notes)}


HIRE_CODE = (EXAMPLES / "hire_basic" / "kv_cache.py").read_text(encoding="utf-8")
# A candidate's own notebook, as one is written: imports (one only a plot needs), constants, a guarded
# import, the answer under %%time, and exploration before and after it that must not run (one cell
# would end the module: a check against a name the notebook's session had, and a plot).
OWN_NOTEBOOK = [
    "import math\nimport numpy as np\nimport matplotlib.pyplot as plt\nfrom dataclasses import dataclass\n\n"
    "KV = 8\nDTYPE = np.float32\nSCALE = 1 / math.sqrt(64)\nnp.random.seed(0)\n",
    "try:\n    from scipy.special import softmax as scipy_softmax\nexcept ImportError:\n    scipy_softmax = None\n",
    "@dataclass\nclass Layout:\n    heads: int = KV\n    head_dim: int = 64\n",
    "%%time\n" + HIRE_CODE,
    "q = np.random.randn(1, 32, 4096, 128)\nplt.imshow(np.tril(np.ones((8, 8))))\nprint(q.shape)\n",
    "np.testing.assert_allclose(gqa_attention(q, cache, n_new), reference_out)\n",
    "if __name__ == '__main__':\n    for T in (1, 8):\n        print(T)\n",
]


# ------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """``{name: report}``: the attacks beside their controls, graded by ``kvkit grade --seed 5`` (``python -m
    grader``, this checkout's)."""
    base = tmp_path_factory.mktemp("handbacks")
    _kv_repeat_zip(base / "control.zip")
    _kv_repeat_zip(base / "attack.zip", padding=EMPTY_FILES)
    folder = base / "attack_folder"
    shutil.copytree(EXAMPLES / "kv_repeat", folder)
    (folder / "pad").mkdir()
    for i in range(EMPTY_FILES):
        (folder / "pad" / f"e{i}.py").touch()
    strong = (EXAMPLES / "strong_hire" / "kv_cache.py").read_text(encoding="utf-8")
    future = "from __future__ import annotations\n"  # the module's first statement: the import goes after it
    scipy = strong.replace(future, future + "from scipy.special import softmax\n", 1)
    assert scipy != strong
    for name, code in (("scipy_control", strong), ("scipy", scipy)):
        (base / name).mkdir()
        (base / name / "kv_cache.py").write_text(code, encoding="utf-8")
    _notebook(base / "own.ipynb", OWN_NOTEBOOK)
    out = base / "reports.json"
    names = ["control.zip", "attack.zip", "attack_folder", "scipy_control", "scipy", "own.ipynb"]
    done = subprocess.run([sys.executable, "-m", "grader", *(str(base / n) for n in names), "--json", str(out),
                           "--seed", "5", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {r["submission"]: r for r in json.loads(out.read_text())}


@pytest.mark.slow  # one batch of six gradings and 40,000 files (make test-slow, CI)
def test_empty_files_that_fill_the_sandbox_gain_nothing_over_their_control(graded):
    """A Weak hand-back beside 20,000 empty files (a zip, a folder) was a grader_error, with no tier and no
    mistakes; its control is Weak with kv_repeat. Now refused before anything is copied, with the count."""
    control = graded["control.zip"]
    assert control["status"] == "graded" and control["tier"] == "Weak" and "kv_repeat" in control["mistakes"]
    for name in ("attack.zip", "attack_folder"):
        report = graded[name]
        assert report["status"] == "not_graded", (name, report["tier_reason"])
        assert f"{EMPTY_FILES:,} of the files under" in report["tier_reason"], report["tier_reason"]
        assert "hand back only your work" in report["tier_reason"]


@pytest.mark.slow  # one batch of six gradings and 40,000 files (make test-slow, CI)
def test_a_module_the_grading_environment_lacks_is_not_a_verdict(graded):
    """Right code that imports scipy (not installed here) was graded Weak 0, "nothing could be measured"."""
    assert importable("scipy") is False, "scipy is installed: the fixture needs an environment without it"
    control, report = graded["scipy_control"], graded["scipy"]
    assert control["status"] == "graded" and control["tier"] != "Weak", control["tier_reason"]
    assert report["status"] == "not_graded", report["tier_reason"]
    assert "'scipy'" in report["tier_reason"] and "Install scipy beside the kit" in report["tier_reason"]
    assert "hand back a version without it" in report["tier_reason"]


@pytest.mark.slow  # one batch of six gradings and 40,000 files (make test-slow, CI)
def test_an_own_notebook_is_graded_on_its_definitions(graded):
    """A right answer under %%time, with exploration around it that fails if run and a guarded scipy import:
    the honest verdict (Hire, as hire_basic's kv_cache.py alone), and a note of what was left out."""
    report = graded["own.ipynb"]
    assert report["status"] == "graded" and report["tier"] == "Hire", report["tier_reason"]
    assert any("left out as exploration" in n and "assert_allclose" in n for n in report["notes"]), report["notes"]


def importable(name: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode == 0


# ------------------------------------------------------------------------------- bounds (unit)
def test_the_bound_is_well_below_what_the_sandbox_holds():
    assert submission.MAX_LAID_OUT * 4 <= launch.WORKDIR_INODES


@pytest.mark.parametrize("kind", ["folder", "zip"])
def test_a_hand_back_past_the_count_is_refused_before_anything_is_copied(tmp_path, kind, monkeypatch):
    """Counted before any file is copied or extracted: files and the folders they need, with the count."""
    folder = tmp_path / "work"
    (folder / "data" / "deep").mkdir(parents=True)
    (folder / "kv_cache.py").write_text(HIRE_CODE)
    for i in range(submission.MAX_LAID_OUT):
        (folder / "data" / "deep" / f"f{i}.json").touch()
    path = folder
    if kind == "zip":
        path = tmp_path / "work.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for file in sorted(folder.rglob("*")):
                if file.is_file():
                    archive.write(file, f"work/{file.relative_to(folder)}")
    copied = []
    monkeypatch.setattr(shutil, "copyfile", lambda *a, **k: copied.append(a))
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: copied.append(a))
    (tmp_path / "out").mkdir()
    with pytest.raises(SubmissionError) as caught:
        materialize(str(path), str(tmp_path / "out"))
    assert not copied and not os.listdir(tmp_path / "out")
    assert f"{submission.MAX_LAID_OUT + 1:,} files" in str(caught.value)
    assert f"{submission.MAX_LAID_OUT:,} of the files under data/deep/" in str(caught.value)


def test_what_the_layout_does_not_read_is_not_counted(tmp_path):
    """Files of kinds never laid out (images), a venv and the skipped folders (.git) do not count."""
    folder = tmp_path / "work"
    for sub in ("venv", ".git", "img"):
        (folder / sub).mkdir(parents=True)
    (folder / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (folder / "kv_cache.py").write_text(HIRE_CODE)
    for i in range(submission.MAX_LAID_OUT + 10):
        (folder / "venv" / f"m{i}.py").touch()
        (folder / ".git" / f"o{i}.json").touch()
        (folder / "img" / f"p{i}.png").touch()
    (tmp_path / "out").mkdir()
    assert materialize(str(folder), str(tmp_path / "out")) == ["kv_cache.py"]


def test_a_sandbox_that_cannot_hold_the_hand_back_says_so():
    """The working folder's bounds, or the launcher's own "no space" before any task: the hand-back's doing."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        for i in range(12):
            Path(work, f"e{i}.py").touch()
        assert sandbox_refusal(work, "", max_files=100, max_bytes=2**20) is None
        why = sandbox_refusal(work, "", max_files=10, max_bytes=2**20)
        assert why and "12 files and folders" in why and "hand back only your work" in why
        said = "kvkit sandbox: setup failed: [Errno 28] No space left on device: '/tmp/work/e3.py'"
        assert "No space left on device" in sandbox_refusal(work, f"starting\n{said}\n", 100, 2**20)
        assert sandbox_refusal(work, "kvkit sandbox: setup failed: [Errno 1] Operation not permitted", 100,
                               2**20) is None


@pytest.mark.parametrize("tail, status, says", [
    ("kvkit sandbox: setup failed: [Errno 28] No space left on device: '/w/e1.py'", "not_graded", "could not lay out"),
    ("kvkit sandbox: setup failed: [Errno 1] Operation not permitted", "grader_error", "Operation not permitted"),
], ids=["no room: the hand-back", "anything else: the kit"])
def test_a_sandbox_that_never_started_is_blamed_on_what_failed(tmp_path, monkeypatch, tail, status, says):
    """No task ran, so no submission code did: a hand-back the working folder cannot hold is not_graded with
    the reason; any other failure is a grader_error that names the kit's sandbox and what it said."""
    from grader.stages import run as run_mod
    from grader.stages.grade import Options, grade

    def never_started(workdir, plan, limits, isolation, port, meanwhile=None):
        return {"numpy": launch.SessionResult(reason="the sandbox ended before every task ran", output_tail=tail),
                "meanwhile": meanwhile()}

    monkeypatch.setattr(run_mod, "run_sessions", never_started)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "kv_cache.py").write_text(HIRE_CODE)
    report = grade(str(tmp_path / "sub"), Options(seed=1, trials=5))
    assert report["status"] == status and says in report["tier_reason"], report["tier_reason"]
    if status == "grader_error":
        assert "the kit's sandbox" in report["tier_reason"]


@pytest.mark.slow
def test_past_the_bound_the_sandbox_failing_is_still_the_hand_backs(tmp_path, monkeypatch):
    """With the count bound lifted, 20,000 empty files reach the sandbox: under namespaces its tmpfs runs out
    of inodes before any task (not_graded, with the count); without them the watchdog kills the child (a
    graded crash, with the reason). Never a grader_error."""
    from grader.stages.grade import Options, grade
    from grader.sandbox import isolation

    monkeypatch.setattr(submission, "MAX_LAID_OUT", 10**6)
    report = grade(str(_kv_repeat_zip(tmp_path / "attack.zip", EMPTY_FILES)),
                   Options(seed=5, trials=5, isolation=isolation.choose("auto")))
    assert report["status"] in ("not_graded", "graded"), report["tier_reason"]
    assert "files" in report["tier_reason"], report["tier_reason"]


# ----------------------------------------------------------------------------- cell magics (unit)
@pytest.mark.parametrize("magic", ["%%time", "%%timeit -n1 -r1", "%%capture out", "%%prun -s cumulative",
                                   "%%capture\n%%time"])
def test_a_cell_magic_that_runs_python_keeps_its_body(tmp_path, magic):
    """A right notebook whose implementation cell opens with %%time was graded Weak 0: the cell was dropped."""
    files = _laid_out(_notebook(tmp_path / "nb.ipynb", ["import numpy as np", f"{magic}\n{HIRE_CODE}"]), tmp_path)
    assert "class KVCache" in files["kv_cache.py"] and "def gqa_attention" in files["kv_cache.py"]
    assert "%%" not in files["kv_cache.py"]
    compile(files["kv_cache.py"], "kv_cache.py", "exec")


def test_a_classroom_implementation_cell_under_time_keeps_its_body(tmp_path):
    source = ROOT / "notebooks" / "source" / "kv_cache" / "kv_cache.ipynb"
    nb = nbformat.read(str(source), as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("kvkit", {}).get("role") == "implementation"]
    cells[-1].source = "%%time\n" + cells[-1].source
    nbformat.write(nb, str(tmp_path / "student.ipynb"))
    plain = _laid_out(source, tmp_path)["kv_cache.py"]
    timed = _laid_out(tmp_path / "student.ipynb", tmp_path)["kv_cache.py"]
    assert timed.replace("student.ipynb", "kv_cache.ipynb") == plain


def test_writefile_lays_out_a_plain_file_and_nothing_else(tmp_path):
    """%%writefile NAME writes that file of the hand-back's folder (-a appends); a path (.., absolute, a
    folder) is never written, anywhere, and a note says so; other cell magics are dropped with a note."""
    cells = ["%%writefile kv_cache.py\n" + HIRE_CODE,
             "%%writefile test_mine.py\nfrom kv_cache import KVCache\n",
             "%%writefile -a test_mine.py\n\ndef test_it():\n    assert KVCache\n",
             "%%writefile ../escape.py\nprint('out')\n",
             f"%%writefile {tmp_path}/absolute.py\nprint('out')\n",
             "%%writefile sub/inner.py\nprint('out')\n",
             "%%bash\necho hi\n",
             "from kv_cache import KVCache\ncache = KVCache(1, 1, 4, 2)\n"]
    notes: list = []
    files = _laid_out(_notebook(tmp_path / "nb.ipynb", cells), tmp_path, notes)
    assert sorted(files) == ["kv_cache.py", "test_mine.py"]
    assert files["kv_cache.py"] == HIRE_CODE.rstrip("\n") + "\n"
    assert files["test_mine.py"] == "from kv_cache import KVCache\n\ndef test_it():\n    assert KVCache\n"
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "absolute.py").exists()
    assert not list(tmp_path.rglob("inner.py")) and not list(tmp_path.rglob("escape.py"))
    text = " | ".join(notes)
    assert "cell 4 (%%writefile ../escape.py)" in text and "cell 6 (%%writefile sub/inner.py)" in text
    assert "cell 7 (%%bash)" in text and "does not run Python" in text
    assert "%%writefile kv_cache.py cell writes" in text


def test_writefile_cells_are_bounded(tmp_path):
    cells = [f"%%writefile f{i}.py\nx = {i}\n" for i in range(submission.MAX_WRITTEN_FILES + 1)]
    (tmp_path / "out").mkdir()
    with pytest.raises(SubmissionError, match=f"write {submission.MAX_WRITTEN_FILES + 1} files"):
        materialize(str(_notebook(tmp_path / "nb.ipynb", cells)), str(tmp_path / "out"))


# ----------------------------------------------------------------------- an own notebook (unit)
def test_an_own_notebook_keeps_its_definitions_and_leaves_out_exploration(tmp_path):
    notes: list = []
    source = _laid_out(_notebook(tmp_path / "own.ipynb", OWN_NOTEBOOK), tmp_path, notes)["kv_cache.py"]
    compile(source, "kv_cache.py", "exec")
    for kept in ("import math", "import numpy as np", "KV = 8", "DTYPE = np.float32", "SCALE = 1 / math.sqrt(64)",
                 "except ImportError:\n    scipy_softmax = None", "@dataclass\nclass Layout:", "class KVCache",
                 "def gqa_attention"):
        assert kept in source, kept
    for left in ("matplotlib", "np.random.seed", "np.random.randn", "plt.imshow", "print(", "assert_allclose",
                 "__main__"):
        assert left not in source, left
    (note,) = [n for n in notes if "left out as exploration" in n]
    assert "cell 1: np.random.seed(0)" in note and "cell 6: np.testing.assert_allclose" in note
    assert "import matplotlib.pyplot as plt (nothing kept uses it)" in note


@pytest.mark.parametrize("code, kept", [
    ("X = 2\nY = X * 3\n", True),
    ("Y = undefined_name * 3\n", False),                  # reads a name nothing kept defines
    ("import math\nEPS = math.ulp(1.0)\n", True),         # a constant in capitals may call a module
    ("import math\neps = math.ulp(1.0)\n", False),        # ... a lower-case name is exploration data
    ("import numpy as np\nQ = np.random.rand(3)\n", False),  # ... never a random draw
    ("from typing import TypeVar\nT = TypeVar('T')\n", True),
    ("def f():\n    return 1\nF1 = f()\n", False),        # ... nor the notebook's own code
    ("NEG_INF = float('-inf')\n", True),
    ("import numpy as np\nf = lambda x: np.exp(x)\n", True),
    ("if __name__ == '__main__':\n    X = 1\n", False),
    ("import sys\nif sys.version_info >= (3, 11):\n    FAST = True\nelse:\n    FAST = False\n", True),
    ("import numpy as np\ncfg = {}\ncfg['a'] = 1\n", False),
], ids=["constants", "undefined", "module call", "lower call", "random", "type variable", "own call", "builtin",
        "lambda", "main guard", "if block", "item set"])
def test_which_assignments_are_definitions(code, kept):
    from grader.stages.layout import own_definitions

    kept_text, left = own_definitions([(1, code)])
    last = code.rstrip("\n").splitlines()[-1].strip()
    if kept:
        assert not left and last in kept_text[0], (kept_text, left)
    else:
        assert left and last not in kept_text[0], (kept_text, left)


def test_a_decorated_definition_keeps_its_decorator():
    from grader.stages.layout import _definitions

    text = _definitions("import functools\n\n@functools.lru_cache(maxsize=None)\ndef f(n):\n    return n\n")
    assert "@functools.lru_cache(maxsize=None)\ndef f(n):" in text


# ------------------------------------------------------------------------------ imports (unit)
def _work(tmp_path: Path, files: dict[str, str]) -> tuple[str, list[str]]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return str(tmp_path), sorted(files)


@pytest.mark.parametrize("error, files, missing", [
    ({"type": "ModuleNotFoundError", "message": "No module named 'scipy'"},
     {"kv_cache.py": "from scipy.special import softmax\n"}, "scipy"),
    ({"type": "ModuleNotFoundError", "message": "No module named 'numba'"},
     {"kv_cache.py": "from helpers import f\n", "helpers.py": "import numba\n"}, "numba"),
    (None, {"kv_cache.py": "try:\n    import scipy\nexcept ImportError:\n    scipy = None\n"}, None),
    ({"type": "ModuleNotFoundError", "message": "No module named 'numpy.secret'"},
     {"kv_cache.py": "import numpy.secret\n"}, None),        # installed: a crash like any other
    ({"type": "ModuleNotFoundError", "message": "No module named 'helpers'"},
     {"kv_cache.py": "import helpers\n", "helpers/__init__.py": ""}, None),  # its own module
    ({"type": "ModuleNotFoundError", "message": "No module named 'jax'"},
     {"kv_cache.py": "import numpy\n"}, None),               # a message no import of its files explains
    ({"type": "ImportError", "message": "No module named 'scipy'"},
     {"kv_cache.py": "import scipy\n"}, None),
    # The error raised by hand, beside an import that never runs: the submission's own crash, graded.
    ({"type": "ModuleNotFoundError", "message": "No module named 'flash_attn'"},
     {"kv_cache.py": "if False:\n    import flash_attn\nraise ModuleNotFoundError(\"No module named 'flash_attn'\")\n"},
     None),
], ids=["scipy", "through a helper", "guarded", "installed", "own", "unexplained", "not ModuleNotFoundError",
        "raised by hand"])
def test_a_missing_module_is_named_only_when_that_is_what_happened(tmp_path, error, files, missing):
    from grader.stages.run import installed_modules

    workdir, rel = _work(tmp_path, files)
    why = missing_module(error, workdir, rel, installed_modules())
    if missing is None:
        assert why is None, why
    else:
        assert f"'{missing}'" in why and f"Install {missing} beside the kit" in why, why


def test_reading_an_own_notebook_costs_the_grader_linear_time():
    """Parsed in the grader's own process: 20,000 imports nothing uses, and 40,000 blocks, taken back or
    kept, each cost a pass (taking back a block once copied every name kept so far: quadratic). A loose
    bound, a containment check."""
    import time

    from grader.stages.layout import own_definitions

    started = time.process_time()
    kept, left = own_definitions([(1, "import os\n" * 20_000), (2, "A = 1\n" + "if A:\n    B = 1\n" * 20_000),
                                  (3, "if A:\n    pass\nelse:\n    C = f()\n" * 20_000)])
    assert time.process_time() - started < 8.0
    assert not kept[0] and kept[1].count("B = 1") == 20_000 and not kept[2] and len(left) == 40_000


def test_the_class_notebooks_released_helpers_are_provided_in_the_sandbox(tmp_path):
    """A student's own-check cell imports kv_helpers.mutants (released beside the notebook): the grader writes
    the kit's copy where that import finds it, as a package, and lists it apart from the hand-back's files."""
    from grader.stages.layout import provide_helpers

    written = provide_helpers(str(tmp_path), ["from kv_helpers.mutants import plant\n"])
    assert written == ["kv_helpers/mutants.py", "kv_helpers/rules.py"]  # the planted masks are the mask rule's
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); import kv_helpers.mutants as m; print(len(m.PLANTED))"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr[-500:]
    assert (tmp_path / "kv_helpers" / "__init__.py").exists()
    assert "def plant" in (tmp_path / "kv_helpers" / "mutants.py").read_text()
    assert provide_helpers(str(tmp_path / "other"), ["import numpy\n"]) == []


def test_a_path_too_long_to_lay_out_is_the_hand_backs_doing(tmp_path):
    """A file 15 folders down whose path the grader's own folder cannot hold (4,095 bytes plus the folder's
    prefix): not graded with the reason, never a grader_error (it was one before)."""
    from grader.stages.layout import SubmissionError, materialize

    hand_back = tmp_path / "h"
    hand_back.mkdir()
    (hand_back / "kv_cache.py").write_text("x = 1\n")
    deep = hand_back
    for i in range(15):
        deep = deep / (chr(ord("a") + i) * 254)
    try:
        deep.mkdir(parents=True)
        (deep / "notes.md").write_text("deep\n")
    except OSError:
        pytest.skip("this file system does not take paths this long")
    with pytest.raises(SubmissionError, match="could not be laid out"):
        materialize(str(hand_back), str(tmp_path / ("w" * 200)), [])


def test_a_notebook_of_millions_of_json_objects_is_refused_before_it_is_parsed(tmp_path):
    import json
    import time

    from grader.stages.layout import SubmissionError, notebook_files

    nb = {"cells": [{"cell_type": "code", "source": "x = 1\n", "metadata": {}, "outputs": [],
                     "execution_count": None}], "metadata": {"x": [{}] * 2_000_000}, "nbformat": 4,
          "nbformat_minor": 5}
    path = tmp_path / "padded.ipynb"
    path.write_text(json.dumps(nb, separators=(",", ":")))
    started = time.process_time()
    with pytest.raises(SubmissionError, match="JSON objects and lists"):
        notebook_files(str(path))
    assert time.process_time() - started < 2


def test_nested_cell_magics_are_read_in_one_pass():
    import time

    import nbformat

    from grader.stages.layout import cell_parts

    cell = nbformat.v4.new_code_cell("%%time\n" * 140_000 + "x = 1\n")
    started = time.process_time()
    assert cell_parts(cell) == ("code", "x = 1\n") or cell_parts(cell)[1].strip() == "x = 1"
    assert time.process_time() - started < 1.0
