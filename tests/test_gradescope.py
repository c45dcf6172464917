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
import tempfile
import tomllib
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "catalogue", "examples")
# Put first on the grading process's path (after the bundle's own source): a bundle that imports the
# reference solution it does not ship fails here, rather than finding the checkout's through its editable install.
BLOCK = ("raise ImportError('the autograder bundle imported solutions/, which it does not ship')\n")


def build(tmp_path, *extra: str) -> str:
    out = os.path.join(str(tmp_path), "autograder.zip")
    done = subprocess.run([sys.executable, "-m", "kvkit.cli", "gradescope", out, "--trials", "20", "--timeout", "60",
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def gradescope_root(tmp_path, bundle: str, keep_modes: bool = True) -> str:
    """``/autograder`` as Gradescope lays it out: source/ (the unzipped bundle), run_autograder, submission/.

    With ``keep_modes=False`` every file and folder is left readable by all, as an unzip that ignores the
    zip's modes leaves them: ``run_autograder`` must take that back before a submission runs.
    """
    root = os.path.join(str(tmp_path), "autograder")
    source = os.path.join(root, "source")
    os.makedirs(source)
    with zipfile.ZipFile(bundle) as zf:
        for info in zf.infolist():
            zf.extract(info, source)
            mode = info.external_attr >> 16
            os.chmod(os.path.join(source, info.filename), mode & 0o777 if mode and keep_modes else 0o755)
    for folder, dirs, _ in os.walk(source):
        for d in dirs:
            os.chmod(os.path.join(folder, d), 0o755)
    os.chmod(source, 0o755)
    shutil.copy(os.path.join(source, "run_autograder"), os.path.join(root, "run_autograder"))
    os.mkdir(os.path.join(root, "submission"))
    block = os.path.join(str(tmp_path), "block", "solutions")
    os.makedirs(block, exist_ok=True)
    with open(os.path.join(block, "__init__.py"), "w") as f:
        f.write(BLOCK)
    return root


def run_autograder(root: str, **env_extra: str) -> dict:
    env = {**os.environ, "KVKIT_AUTOGRADER_ROOT": root, "KVKIT_AUTOGRADER_PYTHON": sys.executable,
           "PYTHONPATH": os.path.join(os.path.dirname(root), "block"), **env_extra}
    done = subprocess.run([os.path.join(root, "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(root, "results", "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build(tmp_path_factory.mktemp("bundle"))


def interviewer_text() -> list[str]:
    """Every interviewer question and expected answer of the kit (interview.toml and mistakes.toml)."""
    with open(os.path.join(ROOT, "catalogue", "interview.toml"), "rb") as f:
        general = tomllib.load(f)["general"]
    with open(os.path.join(ROOT, "catalogue", "mistakes.toml"), "rb") as f:
        mistakes = tomllib.load(f).values()
    texts = [e[key] for e in [*general, *mistakes] for key in ("question", "answer") if key in e]
    assert len(texts) > 20
    return texts


def test_bundle_contents(bundle):
    with zipfile.ZipFile(bundle) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        config = json.loads(zf.read("kvkit_autograder.json"))
        every = {name: zf.read(name).decode("utf-8") for name in infos}
    for script in ("setup.sh", "run_autograder"):
        assert infos[script].external_attr >> 16 & stat.S_IXUSR, script
    assert {"pyproject.toml", "grader/stages/grade.py", "grader/child/zygote.py", "grader/child/tasks.py",
            "grader/sandbox/isolation.py", "grader/sandbox/launch.py", "grader/sandbox/cgroup.py",
            "grader/stages/oracle.py", "grader/bundle_costs.json", "catalogue/mutants.py", "catalogue/mistakes.toml",
            "kvkit/cli.py"} <= set(infos)
    assert not any(n.startswith(("tests/", ".git", ".venv", "catalogue/examples/")) or "__pycache__" in n
                   for n in infos)
    # Nothing to leak: no reference solution, no interviewer question or answer anywhere in the bundle.
    assert not [n for n in infos if n.startswith(("solutions/", "exercises/", "notebooks/"))]
    assert "catalogue/interview.toml" not in infos
    leaked = [(name, text[:60]) for text in interviewer_text() for name, body in every.items() if text in body]
    assert not leaked
    shipped = tomllib.loads(every["catalogue/mistakes.toml"])
    with open(os.path.join(ROOT, "catalogue", "mistakes.toml"), "rb") as f:
        kit = tomllib.load(f)
    assert shipped == {m: {k: v for k, v in e.items() if k not in ("question", "answer")} for m, e in kit.items()}
    # Every file the grader's user's alone, as zipped (run_autograder sets it again on the worker).
    assert {oct(i.external_attr >> 16 & 0o777) for i in infos.values()} == {"0o600", "0o700"}
    from grader.stages import costs

    assert json.loads(every["grader/bundle_costs.json"]) == json.loads(json.dumps(costs.computed()))
    assert config == {"timeout": 60.0, "trials": 20, "isolation": "namespaces", "seed": None,
                      "allow_no_isolation": False}


def test_run_autograder_grades_the_submission(tmp_path, bundle):
    root = gradescope_root(tmp_path, bundle)
    # A student who zipped the folder they worked in: the code sits one level down, beside the starter
    # bundle's own files (step tests, progress.py, unfilled stubs), which are set aside, not graded.
    from grader.shipped.bundle import bundle_contents

    work = os.path.join(root, "submission", "my_work")
    for rel, data in bundle_contents(False).items():
        os.makedirs(os.path.dirname(os.path.join(work, rel)), exist_ok=True)
        with open(os.path.join(work, rel), "wb") as f:
            f.write(data)
    shutil.copy(os.path.join(EXAMPLES, "hire_basic", "kv_cache.py"), os.path.join(work, "kv_cache.py"))
    results = run_autograder(root)
    # Every criterion passes but cost.py and own tests (absent); the optional port, not attempted, counts
    # neither for nor against: the other points are scaled to the same total.
    from grader.stages.rubric import load

    rubric = load()
    points = {cid: spec["points"] for cid, spec in rubric.criteria.items()}
    earned = sum(points.values()) - points["cost_model"] - points["own_tests"] - points["torch_port"]
    total = rubric.max_score
    assert results["score"] == pytest.approx(earned * total / (total - points["torch_port"]), abs=0.05)
    assert results["max_score"] == total and results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))
    assert not [t for t in results["tests"] if "PyTorch port" in t["name"]]  # optional, not attempted: no test
    assert "Not attempted, optional: PyTorch port" in results["output"]
    assert results["output"].startswith("Result: Meets expectations")  # the class's words, not hiring's
    assert "Hire" not in results["output"] and "Weak" not in results["output"]
    assert results["extra_data"]["tier"] == "Hire"
    assert len(results["tests"]) == len(points) - 1  # one test a criterion, but the port not attempted
    assert all({"name", "score", "max_score", "output"} <= set(t) for t in results["tests"])
    assert round(sum(t["score"] for t in results["tests"]), 2) == results["score"]


def test_run_autograder_survives_a_cheat(tmp_path, bundle):
    """A submission that writes its own perfect results.json and runs the grader's oracle gets neither."""
    root = gradescope_root(tmp_path, bundle)
    target = os.path.join(root, "results", "results.json")
    source = os.path.join(root, "source", "grader", "stages", "oracle.py")
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
    bundle = build(tmp_path, "--rubric", str(rubric), "--seed", "5", "--isolation", "process", "--allow-no-isolation")
    with zipfile.ZipFile(bundle) as zf:
        config = json.loads(zf.read("kvkit_autograder.json"))
        assert "rubric.toml" in zf.namelist()
    assert config == {"timeout": 60.0, "trials": 20, "isolation": "process", "seed": 5, "rubric": "rubric.toml",
                      "allow_no_isolation": True}
    bad = subprocess.run([sys.executable, "-m", "kvkit.cli", "gradescope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2
    # Without namespaces only by a named opt-out: no bundle is built, and the refusal names it.
    for level in ("process", "auto"):
        out = str(tmp_path / f"{level}.zip")
        refused = subprocess.run([sys.executable, "-m", "kvkit.cli", "gradescope", out, "--isolation", level],
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "--allow-no-isolation" in refused.stderr and not os.path.exists(out)


# ---------------------------------------------------------------------- nothing of the kit reaches a submission

# A submission that walks the bundle's folder and opens every file it finds, and every file the bundle holds by
# its path (a folder it cannot list may still let it open a file by name), then fails to import with what it
# read: a leak would reach results.json. It also reads a world-readable file beside the bundle (the control:
# readable wherever the kit's files are not hidden), and marks that it ran.
SNOOP = r'''
import os
BUNDLE, FILES, CONTROL, MARK = {bundle!r}, {files!r}, {control!r}, {mark!r}
try:
    open(MARK, "w").close()
except OSError:
    pass
paths = set(FILES)
for folder, dirs, names in os.walk(BUNDLE):
    paths.update(os.path.join(folder, n) for n in names)
stolen = {{}}
for path in sorted(paths):
    try:
        with open(path, "rb") as f:
            stolen[path] = f.read()
    except OSError:
        pass
own = len(open(__file__, "rb").read()) > 0
try:
    control = open(CONTROL).read().strip()
except OSError:
    control = "unreadable"
print("LEAKED", stolen) if stolen else None
if stolen:
    raise RuntimeError("LEAKED " + repr(b"".join(stolen.values())[:1500]))
raise RuntimeError(f"read nothing of {{len(paths)}} files; own file read: {{own}}; control: {{control}}")
'''


@pytest.fixture
def world_tmp():
    """A temporary folder any uid may enter (pytest's own are the user's alone, which would hide the bundle
    from a submission of another uid whatever the bundle's modes)."""
    path = tempfile.mkdtemp(prefix="kvkit-gradescope-test-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def snooping_root(tmp: str, bundle: str) -> tuple[str, list[str], str]:
    """A Gradescope root whose bundle was unzipped readable by all, and the snooping submission in it."""
    root = gradescope_root(tmp, bundle, keep_modes=False)
    source = os.path.join(root, "source")
    files = sorted(os.path.join(folder, n) for folder, _, names in os.walk(source) for n in names)
    control, mark = os.path.join(tmp, "control.txt"), os.path.join(tmp, "marks", "ran")
    with open(control, "w") as f:
        f.write("CONTROL-READ\n")
    os.chmod(control, 0o644)
    os.makedirs(os.path.dirname(mark), mode=0o777)
    os.chmod(os.path.dirname(mark), 0o777)
    with open(os.path.join(root, "submission", "kv_cache.py"), "w") as f:
        f.write(SNOOP.format(bundle=source, files=files, control=control, mark=mark))
    return root, files, mark


def assert_read_nothing(results: dict, files: list[str], control: str) -> None:
    text = json.dumps(results)
    assert "LEAKED" not in text
    assert f"read nothing of {len(files)} files; own file read: True; control: {control}" in text, text[:3000]
    # Nor any of the kit's text by another way (the oracle's docstring, the shell scripts, the costs).
    assert "The direct reference the grader trusts" not in text and "find_python" not in text
    assert "kv_bytes_per_token(32, 8, 128, 2)" not in text


def namespaces_available() -> bool:
    from grader.sandbox import isolation

    chosen = isolation.choose("namespaces")
    return chosen.wrap is not None and chosen.wrap.namespaces


def test_a_submission_reads_nothing_of_the_bundle_with_namespaces(world_tmp, bundle):
    if os.environ.get("KVKIT_NO_NAMESPACES") or not namespaces_available():
        pytest.skip("this machine offers no Linux namespaces (the bundle would refuse to grade: see "
                    "test_a_bundle_without_the_opt_out_grades_nothing_without_namespaces)")
    root, files, mark = snooping_root(world_tmp, bundle)
    results = run_autograder(root)
    assert len(files) > 40 and os.path.exists(os.path.join(root, "source", "grader", "stages", "oracle.py"))
    # The kit's folders are not there at all (the control outside them is not either): nothing to read.
    assert_read_nothing(results, files, "unreadable")
    assert results["extra_data"]["isolation"].startswith("namespaces")
    assert not [t for t in results["tests"] if t["name"] == "NO ISOLATION"]
    # The bundle is the grader's alone on disk too, though it was unzipped readable by all.
    assert not [p for p in files + [os.path.join(root, "source")] if os.lstat(p).st_mode & 0o077]


def _open_to_all(path: str) -> bool:
    """Whether any uid may reach ``path``: every folder above it lets others in."""
    path = os.path.realpath(path)
    parents = [os.path.dirname(path)]
    while parents[-1] != os.path.dirname(parents[-1]):
        parents.append(os.path.dirname(parents[-1]))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parents) and bool(os.stat(path).st_mode & stat.S_IROTH)


@pytest.fixture(scope="module")
def python_for_another_uid():
    """The grading Python as ``setup.sh`` makes one, which the submission's uid may run too: this one where any
    uid can reach it, else a virtualenv of the system's Python of the same version over this one's
    site-packages (the kit's Python may sit in root's home, which no other uid may enter)."""
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    if not _open_to_all(site) or site != sysconfig.get_paths()["platlib"]:
        pytest.skip(f"another uid cannot read the kit's site-packages ({site})")
    if _open_to_all(sys.executable):
        yield sys.executable
        return
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next((p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}")
                   if os.path.exists(p) and _open_to_all(p)), None)
    if system is None:
        pytest.skip(f"no {version} that another uid may run (the kit's is {sys.executable})")
    folder = tempfile.mkdtemp(prefix="kvkit-gradescope-venv-")
    os.chmod(folder, 0o755)
    try:
        venv = os.path.join(folder, "venv")
        subprocess.run([system, "-m", "venv", "--without-pip", venv], check=True, capture_output=True, timeout=60)
        own_site = os.path.join(venv, "lib", version, "site-packages")
        shutil.rmtree(own_site)
        os.symlink(site, own_site)
        python = os.path.join(venv, "bin", "python")
        subprocess.run([python, "-c", "import numpy"], check=True, capture_output=True, timeout=60)
        yield python
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def bundle_no_isolation(tmp_path_factory):
    return build(tmp_path_factory.mktemp("bundle_no_isolation"), "--allow-no-isolation")


def test_a_submission_reads_nothing_of_the_bundle_without_namespaces(world_tmp, bundle_no_isolation,
                                                                    python_for_another_uid):
    if os.geteuid() != 0:
        pytest.skip("the bundle grades without namespaces only as root (Gradescope runs run_autograder as root), "
                    "where the submission gets a uid of its own; as another user it grades nothing (tested beside)")
    root, files, mark = snooping_root(world_tmp, bundle_no_isolation)
    # A worker without namespaces, the opt-out built in.
    results = run_autograder(root, KVKIT_NO_NAMESPACES="1", KVKIT_AUTOGRADER_PYTHON=python_for_another_uid)
    assert os.path.exists(mark) and os.stat(mark).st_uid != 0  # it ran, as a uid of its own
    # The control beside the bundle was read: only the bundle's modes kept the submission out of it.
    assert_read_nothing(results, files, "CONTROL-READ")
    assert results["extra_data"]["isolation"].startswith("process (own uid")
    # Every result tells the staff, in a test only they see; the student's own output does not say it.
    staff = [t for t in results["tests"] if t["name"] == "NO ISOLATION"]
    assert len(staff) == 1 and staff[0]["visibility"] == "hidden" and staff[0]["max_score"] == 0
    assert staff[0]["output"].startswith("NO ISOLATION: this worker offers no Linux namespaces")
    assert "graded anyway: the submission ran as a uid of its own" in staff[0]["output"]
    assert "NO ISOLATION" not in results["output"]
    assert not [p for p in files + [os.path.join(root, "source")] if os.lstat(p).st_mode & 0o077]


def test_a_bundle_without_the_opt_out_grades_nothing_without_namespaces(world_tmp, bundle):
    root, files, mark = snooping_root(world_tmp, bundle)
    results = run_autograder(root, KVKIT_NO_NAMESPACES="1")
    assert not os.path.exists(mark)  # the submission never ran
    assert results["score"] == 0 and "could not isolate your code" in results["output"]
    assert "NO ISOLATION" not in results["output"]
    [staff] = results["tests"]
    assert staff["name"] == "NO ISOLATION" and staff["visibility"] == "hidden"
    assert staff["output"].startswith("NO ISOLATION, NOTHING GRADED") and "--allow-no-isolation" in staff["output"]


def test_the_bundle_names_a_mistake_without_the_reference(tmp_path, bundle_no_isolation):
    """Diagnosis plants the catalogue's mistakes around the grader's oracle, and cost.py is checked against the
    figures the bundle carries: the bundle names missing_scale by reproduction and passes a right cost.py, with
    no solutions/ to import (the blocker on the path fails any import of it)."""
    root = gradescope_root(tmp_path, bundle_no_isolation)
    for name in ("kv_cache.py", "cost.py"):
        shutil.copy(os.path.join(EXAMPLES, "missing_scale", name), os.path.join(root, "submission"))
    results = run_autograder(root)
    assert "missing_scale" in results["extra_data"]["mistakes"], results["output"]
    [cost] = [t for t in results["tests"] if "cost.py" in t["name"]]
    assert cost["score"] == cost["max_score"] > 0, cost


def test_mistakes_planted_around_the_oracle_are_the_references():
    """What diagnosis plants around the grader's oracle gives the outputs it gave around the reference solution,
    for every reproduced variant on the smallest hidden trials (float32 ones included)."""
    import types

    from catalogue import mutants
    from grader.stages import diagnose, jobs, suite
    from grader.child import tasks as child_tasks
    from solutions import kv_cache as reference

    def planted_on_reference(variant, trial):
        KVCache, attention = mutants.plant(variant, reference.KVCache, reference.gqa_attention)
        spec, data = jobs.encode([trial])
        records, flat = child_tasks.run_trials(types.SimpleNamespace(KVCache=KVCache, gqa_attention=attention),
                                               spec["trials"], data)
        flat = iter(flat)
        return [next(flat).reshape(s.q.shape) if records[0][i].get("stored") else None
                for i, s in enumerate(trial.steps) if i < len(records[0])]

    trials = sorted(suite.hidden_suite(11, count=20), key=lambda t: t.size)
    trials = trials[:30] + [t for t in trials if t.dtype == "float32"][:5]
    compared = 0
    for trial in trials:
        for variant in (v for vs in diagnose.REPRODUCED.values() for v in vs):
            ours, theirs = diagnose._run_variant(variant, trial), planted_on_reference(variant, trial)
            for step, a, b in zip(trial.steps, ours, theirs):
                assert (a is None) == (b is None), (trial.name, variant)
                if a is not None:
                    real = (np.arange(a.shape[2])[None, :] < step.n_new[:, None])[:, None, :, None]
                    real = np.broadcast_to(real, a.shape)
                    np.testing.assert_allclose(a[real], b[real], rtol=1e-6, atol=1e-6, err_msg=f"{trial.name} {variant}")
                    compared += 1
    assert compared > 200
