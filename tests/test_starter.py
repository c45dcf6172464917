"""``kvkit starter OUTDIR``: the candidate's take-home bundle.

Built into a temporary directory and checked: the files it should hold and
no others; its tests run with only the bundle and its dependencies (a bare
virtual environment that sees numpy, pytest, rich and torch but not the kit),
fail on the stubs naming each step, and pass, step 7 included, once the stubs
are filled with the reference. That it holds nothing private (no import of the
kit, no line of solutions/ or grader/, no interviewer text) is ``kvkit
check-kit``'s (grader/batch/check_kit.py ``check_bundle``; tests/test_check_kit.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from grader.shipped import bundle as shipped
from kvkit import starter

KIT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "README.md", "requirements.txt", "kv_cache.py", "kv_cache_torch.py", "cost.py", "test_mine.py", "steps.toml",
    "pytest.ini", "progress.py", "catalogue/mutants.py", "catalogue/structure.py", "catalogue/rules.py",
    "catalogue/mistakes.toml",
    "tests/adapters.py", "tests/conftest.py", "tests/stepkit.py", "tests/opwatch.py",
    "tests/test_step1_cache.py", "tests/test_step2_heads.py", "tests/test_step3_mask.py",
    "tests/test_step4_ragged.py", "tests/test_step5_cost.py", "tests/test_step6_torch.py",
    "tests/test_step7_own_tests.py",
}


def _test_steps():
    spec = importlib.util.spec_from_file_location("kvkit_test_steps_helpers", Path(__file__).with_name("test_steps.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("starter") / "take-home"
    assert starter.main([str(out), "--zip"]) == 0
    return out


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A python that sees the kit's dependencies but not the kit (no solutions, grader, catalogue, kvkit).

    A fresh venv whose only link to the kit's environment is a .pth line naming
    its site-packages: .pth files *in* that directory (the kit's editable
    install) are not processed, so the kit stays invisible.
    """
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "kit-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([python, "-c", "import numpy, pytest, torch\n"
                            "for name in ('solutions', 'grader', 'catalogue', 'kvkit'):\n"
                            "    try:\n        __import__(name)\n    except ImportError:\n        pass\n"
                            "    else:\n        raise SystemExit(name + ' is importable')\n"],
                           capture_output=True, text=True, cwd=venv)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    return python


def bare_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KVKIT_IMPL", "PYTHONPATH")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # quicker step 7 runs (see test_steps.py)
    return env


def test_the_bundle_holds_the_stubs_tests_readme_and_nothing_else(bundle):
    files = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    assert files == EXPECTED
    for name in ("kv_cache.py", "kv_cache_torch.py", "cost.py", "test_mine.py"):
        stubbed, filled = shipped.unfinished_functions(bundle / name)
        assert stubbed and not filled, f"{name}: {filled} are filled in"
    readme = (bundle / "README.md").read_text()
    for needed in ("## The contract", "## What to hand back", "python progress.py", "kv_cache.py",
                   "KVCache(batch, kv_heads, max_len, head_dim", "gqa_attention(q, cache, n_new)"):
        assert needed in readme, needed
    steps = tomllib.loads((bundle / "steps.toml").read_text())["step"]
    assert [s["number"] for s in steps] == list(range(1, 8)) and not any(s["hints"] for s in steps)


def test_the_leak_check_sees_copied_code(tmp_path):
    shutil.copyfile(KIT / "solutions" / "kv_cache.py", tmp_path / "kv_cache.py")
    assert len(shipped.shared_lines(tmp_path, run=1)) > 20
    assert shipped.shared_lines(tmp_path, run=shipped.COPIED_RUN)


def test_the_zip_holds_the_same_files(bundle):
    archive = bundle.with_name(bundle.name + ".zip")
    with zipfile.ZipFile(archive) as zf:
        names = {n.split("/", 1)[1] for n in zf.namelist()}
    assert names == EXPECTED


@pytest.mark.slow  # every step in the bundle (make test-slow); make test runs steps 1 and 7 there, and all 7 in the kit
def test_the_bundle_tests_fail_on_the_stubs_naming_each_step(bundle, bare_python):
    code = ("import json, sys; from pathlib import Path; import progress as p\n"
            "folder = Path('.').resolve()\n"
            "rows = [(s.number, r.status, r.failure) for s in p.load_steps(folder) for r in [p.run_step(s, folder)]]\n"
            "print(json.dumps(rows))\n")
    proc = subprocess.run([bare_python, "-c", code], cwd=bundle, capture_output=True, text=True, env=bare_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r[0] for r in rows] == list(range(1, 8))
    for number, status, failure in rows:
        assert status == "pending", f"step {number} passed on the stubs"
        assert failure.startswith(f"step {number}:"), failure


def test_hint_in_the_bundle_says_there_are_none(bundle, bare_python):
    proc = subprocess.run([bare_python, "progress.py", "hint"], cwd=bundle, capture_output=True, text=True,
                          env=bare_env(), timeout=300)
    assert proc.returncode == 0 and "Step 1:" in proc.stdout and "no hints" in proc.stdout, proc.stdout + proc.stderr


def test_step_7_works_in_a_filled_bundle_without_the_kit(bundle, bare_python, tmp_path):
    """Step 7 is the step that needs the bundle's own catalogue/mutants.py; the others share step 1's plumbing."""
    filled = tmp_path / "filled"
    shutil.copytree(bundle, filled)
    _test_steps().filled_dir(filled)
    code = ("import json; from pathlib import Path; import progress as p\n"
            "folder = Path('.').resolve()\n"
            "steps = [s for s in p.load_steps(folder) if s.number in (1, 7)]\n"
            "print(json.dumps([(r.step.number, r.status, r.failure, r.properties) for r in p.run_all(steps, folder)]))\n")
    proc = subprocess.run([bare_python, "-c", code], cwd=filled, capture_output=True, text=True, env=bare_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for number, status, failure, _ in rows:
        assert status == "done", f"step {number} in the filled bundle: {failure}"
    matrix = json.loads(rows[-1][3]["kill_matrix"])
    assert matrix["chunk_local_mask"] == "fail" and matrix["your kv_cache.py"] == "pass"


def test_hints_only_when_asked(tmp_path, bare_python):
    out = tmp_path / "bundle"
    assert starter.main([str(out), "--hints"]) == 0
    steps = tomllib.loads((out / "steps.toml").read_text())["step"]
    assert steps == tomllib.loads((KIT / "exercises" / "steps.toml").read_text())["step"]
    proc = subprocess.run([bare_python, "progress.py", "hint", "--step", "3"], cwd=out, capture_output=True,
                          text=True, env=bare_env(), timeout=300)
    assert proc.returncode == 0 and f"Hint 1 of {len(steps[2]['hints'])}: {steps[2]['hints'][0]}" in proc.stdout
    bare = tmp_path / "bare"
    assert starter.main([str(bare)]) == 0
    plain = tomllib.loads((bare / "steps.toml").read_text())["step"]
    assert [{k: v for k, v in s.items() if k not in shipped.HINT_KEYS} for s in plain] == \
        [{k: v for k, v in s.items() if k not in shipped.HINT_KEYS} for s in steps]


def test_it_refuses_a_non_empty_directory_and_filled_stubs(tmp_path, capsys):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert starter.main([str(out)]) == 2
    assert starter.main([str(out), "--force"]) == 2  # not an earlier bundle: left alone
    assert (out / "notes.txt").is_file()
    exercises = tmp_path / "exercises"
    shutil.copytree(KIT / "exercises", exercises, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(KIT / "solutions" / "kv_cache.py", exercises / "kv_cache.py")
    with pytest.raises(shipped.BuildError, match="filled in"):
        shipped.build(tmp_path / "other", exercises=exercises)
    assert starter.main([]) == 2
    capsys.readouterr()


def test_force_replaces_an_earlier_bundle(tmp_path):
    out = tmp_path / "bundle"
    assert starter.main([str(out)]) == 0
    (out / "kv_cache.py").write_text("# edited")
    assert starter.main([str(out), "--force"]) == 0
    assert "NotImplementedError" in (out / "kv_cache.py").read_text()


def test_a_whole_working_folder_grades_like_the_clean_hand_back(tmp_path):
    import shutil

    from grader.stages.grade import Options, grade

    folder = tmp_path / "folder"
    shipped.build(folder)
    for name in ("kv_cache.py", "cost.py"):  # the candidate's work; the port and test_mine.py left as stubs
        shutil.copyfile(shipped.KIT / "solutions" / name, folder / name)
    clean = tmp_path / "clean"
    clean.mkdir()
    for name in ("kv_cache.py", "cost.py"):
        shutil.copyfile(folder / name, clean / name)
    zipped = shutil.make_archive(str(tmp_path / "handback"), "zip", tmp_path, "folder")
    a, b, z = (grade(str(p), Options(seed=4, trials=20)) for p in (folder, clean, zipped))
    assert a["status"] == b["status"] == z["status"] == "graded"
    assert (a["tier"], a["score"], a["mistakes"]) == (b["tier"], b["score"], b["mistakes"]), a["tier_reason"]
    assert (z["tier"], z["score"], z["mistakes"]) == (b["tier"], b["score"], b["mistakes"]), z["tier_reason"]
    assert any("set aside" in n and "progress.py" in n for n in a["notes"])
    assert not any("set aside" in n for n in b["notes"])
    # The parts left as stubs say so, rather than reading as files the candidate forgot.
    said = {c["id"]: c["evidence"] for c in a["criteria"]}
    assert "kv_cache_torch.py, the starter bundle's unfilled stub" in said["torch_port"], said["torch_port"]
    assert "test_mine.py, the starter bundle's unfilled stub" in said["own_tests"], said["own_tests"]
    assert "stub" not in {c["id"]: c["evidence"] for c in b["criteria"]}["torch_port"]


def test_an_edited_step_test_is_still_the_kits_and_set_aside(tmp_path):
    """A step test handed back with one comment added is not the candidate's own test: set aside by its path
    (said so), while the candidate's own test file and code are kept."""
    from grader.stages.layout import set_aside_bundle

    step = (KIT / "exercises" / "tests" / "test_step3_mask.py").read_text()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_step3_mask.py").write_text("# my note\n" + step)
    (tmp_path / "test_mine.py").write_text("def test_mine():\n    assert True\n")
    (tmp_path / "kv_cache.py").write_text("# mine\n")
    kept, aside = set_aside_bundle(str(tmp_path), ["kv_cache.py", "test_mine.py", "tests/test_step3_mask.py"])
    assert kept == ["kv_cache.py", "test_mine.py"] and aside == ["tests/test_step3_mask.py (edited)"]
    assert not (tmp_path / "tests" / "test_step3_mask.py").exists()


def test_nothing_in_the_bundle_speaks_the_hiring_language(tmp_path):
    """No tier name of any audience in grader/rubric.toml, and no "top verdict", in any file of either bundle."""
    import re

    audiences = tomllib.loads((KIT / "grader" / "rubric.toml").read_text())["audiences"]
    words = sorted({name for names in audiences.values() for name in names} | {"top verdict"})
    assert {"Weak", "Hire", "Strong Hire", "Needs work", "Exceeds expectations"} <= set(words), words
    pattern = re.compile(r"(?<![A-Za-z])(" + "|".join(re.escape(w) for w in words) + r")(?![A-Za-z])", re.IGNORECASE)
    for hints in (False, True):
        out = tmp_path / f"bundle-{hints}"
        shipped.build(out, hints=hints)
        found = []
        for path in sorted(out.rglob("*")):
            if path.is_file():
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                    found += [f"{path.relative_to(out)}:{number}: {m[0]!r} in {line.strip()!r}"
                              for m in pattern.finditer(line)]
        assert not found, "\n".join(found)
