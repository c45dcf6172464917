"""A student runs the released notebook in an environment made from the assignment alone.

The instructor's ``nbgrader generate_assignment`` releases the notebook with its
``requirements.txt`` and ``kv_helpers/`` (docs/notebook.md). Here a fresh virtual
environment gets ``pip install -r requirements.txt`` and nothing else (no kit: no
``grader``, ``catalogue``, ``solutions`` or ``kvkit``), and the released notebook runs in
it with a real Jupyter kernel (nbclient): every cell before the first answer runs, the
cells that need no answer (the pictures, the op recorder, the planted mistakes) run, and
every other cell fails only with the ``NotImplementedError`` of an answer not written yet.

Marked slow (``make test-slow``): the environment takes a minute or two to install
(numpy, matplotlib, torch, ipykernel and JupyterLab, from the machine's package index).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from test_notebook import ASSIGNMENT, NOTEBOOK, RELEASED, generated_course

pytestmark = pytest.mark.slow

# Answer-free cells after the first answer: each must run in the student's environment.
RUN_WITHOUT_ANSWERS = {"heads_picture", "mask_picture", "consistency_helpers", "torch_setup", "torch_ops_demo",
                       "torch_helpers", "own_mutants"}


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The student version, made by nbgrader from a copy of the course (links to the kit's helpers followed)."""
    tmp = tmp_path_factory.mktemp("course")
    course, _ = generated_course(tmp)
    folder = course / "release" / ASSIGNMENT
    assert {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} == RELEASED
    return folder


@pytest.fixture(scope="module")
def student_python(tmp_path_factory, release) -> str:
    """A fresh virtual environment holding what ``pip install -r requirements.txt`` installs, and nothing else."""
    venv = tmp_path_factory.mktemp("student") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "-r", "requirements.txt"], cwd=release, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = ("import importlib.util, sys\n"
             "kit = [n for n in ('grader', 'catalogue', 'solutions', 'kvkit', 'nbgrader') if importlib.util.find_spec(n)]\n"
             "sys.exit(f'the kit is importable: {kit}' if kit else 0)\n")
    proc = subprocess.run([python, "-c", probe], cwd=venv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def test_the_released_notebook_runs_in_a_student_environment(release, student_python, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    kernel = tmp_path / "jupyter" / "kernels" / "student"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [student_python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "student", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the kernel sees its own environment and its folder only
    monkeypatch.setenv("MPLBACKEND", "Agg")

    nb = nbformat.read(release / f"{NOTEBOOK}.ipynb", as_version=4)
    NotebookClient(nb, kernel_name="student", timeout=600, allow_errors=True,
                   resources={"metadata": {"path": str(release)}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    meta = [c.metadata.get("nbgrader", {}) for c in code]
    errors = {m["grade_id"]: [(o.ename, o.evalue) for o in c.outputs if o.output_type == "error"]
              for c, m in zip(code, meta)}
    first_answer = next(i for i, m in enumerate(meta) if m.get("solution"))
    assert first_answer > 0
    before = [m["grade_id"] for m in meta[:first_answer]]
    assert all(not errors[g] for g in before), {g: errors[g] for g in before}
    assert all(not errors[g] for g in RUN_WITHOUT_ANSWERS), {g: errors[g] for g in RUN_WITHOUT_ANSWERS}
    others = {g: e for g, e in errors.items() if e and any(name != "NotImplementedError" for name, _ in e)}
    assert not others, f"cells failing with something other than an unwritten answer: {others}"
    graded = [m["grade_id"] for m in meta if m.get("grade")]
    assert all(errors[g] for g in graded), "every graded cell fails on the unwritten answers"
    # What the op recorder and the planted mistakes printed: they ran on the helpers released beside the notebook.
    printed = {m["grade_id"]: "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")
               for c, m in zip(code, meta)}
    assert "copies as large as K" in printed["torch_ops_demo"], printed["torch_ops_demo"]
    assert "planted mistakes" in printed["own_mutants"], printed["own_mutants"]
