"""``kvkit gradescope OUT.zip``: the bundle's contents, and its ``run_autograder`` run against a local
directory laid out like Gradescope's (``KVKIT_AUTOGRADER_ROOT`` points it there; the kit's own
virtualenv stands in for the one ``setup.sh`` would build)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "catalogue", "examples")


def build(tmp_path, *extra: str) -> str:
    out = str(tmp_path / "autograder.zip")
    done = subprocess.run([sys.executable, "-m", "kvkit.cli", "gradescope", out, "--trials", "20", "--timeout", "60",
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def gradescope_root(tmp_path, bundle: str) -> str:
    """``/autograder`` as Gradescope lays it out: source/ (the unzipped bundle), run_autograder, submission/."""
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as zf:
        for info in zf.infolist():
            zf.extract(info, root / "source")
            mode = info.external_attr >> 16
            if mode:
                os.chmod(root / "source" / info.filename, mode & 0o777)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    return str(root)


def run_autograder(root: str) -> dict:
    env = {**os.environ, "KVKIT_AUTOGRADER_ROOT": root, "KVKIT_AUTOGRADER_PYTHON": sys.executable}
    done = subprocess.run([os.path.join(root, "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(root, "results", "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build(tmp_path_factory.mktemp("bundle"))


def test_bundle_contents(bundle):
    with zipfile.ZipFile(bundle) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        config = json.loads(zf.read("kvkit_autograder.json"))
    for script in ("setup.sh", "run_autograder"):
        assert infos[script].external_attr >> 16 & stat.S_IXUSR, script
    assert {"pyproject.toml", "grader/grade.py", "grader/child/zygote.py", "grader/child/tasks.py",
            "grader/sandbox/isolation.py", "grader/sandbox/launch.py", "grader/sandbox/cgroup.py",
            "solutions/kv_cache.py", "catalogue/mutants.py", "kvkit/cli.py"} <= set(infos)
    assert not any(n.startswith(("tests/", ".git", ".venv", "catalogue/examples/")) or "__pycache__" in n
                   for n in infos)
    assert config == {"timeout": 60.0, "trials": 20, "isolation": "auto", "seed": None}


def test_run_autograder_grades_the_submission(tmp_path, bundle):
    root = gradescope_root(tmp_path, bundle)
    # A student who zipped the folder they worked in: the code sits one level down, beside the starter
    # bundle's own files (step tests, progress.py, unfilled stubs), which are set aside, not graded.
    from kvkit.starter import bundle_contents

    work = os.path.join(root, "submission", "my_work")
    for rel, data in bundle_contents(False).items():
        os.makedirs(os.path.dirname(os.path.join(work, rel)), exist_ok=True)
        with open(os.path.join(work, rel), "wb") as f:
            f.write(data)
    shutil.copy(os.path.join(EXAMPLES, "hire_basic", "kv_cache.py"), os.path.join(work, "kv_cache.py"))
    results = run_autograder(root)
    # Every criterion passes but cost.py and own tests (absent); the optional port, not attempted, counts
    # neither for nor against: the other points are scaled to the same total.
    from grader.rubric import load

    points = {cid: spec["points"] for cid, spec in load().criteria.items()}
    earned = sum(points.values()) - points["cost_model"] - points["own_tests"] - points["torch_port"]
    assert results["score"] == pytest.approx(earned * 100 / (100 - points["torch_port"]), abs=0.05)
    assert results["max_score"] == 100.0 and results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))
    assert not [t for t in results["tests"] if "PyTorch port" in t["name"]]  # optional, not attempted: no test
    assert "Not attempted, optional: PyTorch port" in results["output"]
    assert results["output"].startswith("Result: Meets expectations")  # the class's words, not hiring's
    assert "Hire" not in results["output"] and "Weak" not in results["output"]
    assert results["extra_data"]["tier"] == "Hire"
    assert len(results["tests"]) == 12
    assert all({"name", "score", "max_score", "output"} <= set(t) for t in results["tests"])
    assert round(sum(t["score"] for t in results["tests"]), 2) == results["score"]


def test_run_autograder_survives_a_cheat(tmp_path, bundle):
    """A submission that writes its own perfect results.json and reads the reference gets neither."""
    root = gradescope_root(tmp_path, bundle)
    target = os.path.join(root, "results", "results.json")
    source = os.path.join(root, "source", "solutions", "kv_cache.py")
    with open(os.path.join(root, "submission", "kv_cache.py"), "w") as f:
        f.write("import json, os\n"
                "for path in (%r, '/autograder/results/results.json'):\n"
                "    try:\n"
                "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
                "        with open(path, 'w') as out:\n"
                "            json.dump({'score': 100.0, 'output': 'pwned'}, out)\n"
                "    except OSError:\n"
                "        pass\n"
                "exec(open(%r).read())\n" % (target, source))
    results = run_autograder(root)
    assert results["score"] == 0.0 and "pwned" not in json.dumps(results)
    assert "Result: Needs work" in results["output"]
    assert "kv_cache.py: failed to import" in results["output"]


def test_run_autograder_without_a_submission(tmp_path, bundle):
    root = gradescope_root(tmp_path, bundle)
    results = run_autograder(root)
    assert results["score"] == 0.0 and "No submission found" in results["output"]


def test_run_autograder_when_python_is_missing(tmp_path, bundle):
    """Even an autograder that cannot start leaves a results.json the student can read."""
    root = gradescope_root(tmp_path, bundle)
    env = {**os.environ, "KVKIT_AUTOGRADER_ROOT": root, "KVKIT_AUTOGRADER_PYTHON": "/nonexistent/python"}
    subprocess.run([os.path.join(root, "run_autograder")], env=env, capture_output=True, timeout=60, check=True)
    with open(os.path.join(root, "results", "results.json")) as f:
        results = json.load(f)
    assert results["score"] == 0 and "could not run" in results["output"]


def test_bundle_options(tmp_path):
    rubric = tmp_path / "rubric.toml"
    shutil.copy(os.path.join(ROOT, "grader", "rubric.toml"), rubric)
    bundle = build(tmp_path, "--rubric", str(rubric), "--seed", "5", "--isolation", "process")
    with zipfile.ZipFile(bundle) as zf:
        config = json.loads(zf.read("kvkit_autograder.json"))
        assert "rubric.toml" in zf.namelist()
    assert config == {"timeout": 60.0, "trials": 20, "isolation": "process", "seed": 5, "rubric": "rubric.toml"}
    bad = subprocess.run([sys.executable, "-m", "kvkit.cli", "gradescope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2
