"""Step 7: your own tests (test_mine.py) catch the planted mistakes.

Runs test_mine.py with pytest, in a fresh process, once against your own
kv_cache.py and once against each planted mutant of the mistakes catalogue
(catalogue/mutants.py: each makes one catalogued mistake, wrapped around your
own KVCache and gqa_attention). test_mine.py sees them through a shim module
named ``kv_cache`` that re-exports your names with the mutant's KVCache and
gqa_attention swapped in; the environment variable KVKIT_MUTANT picks it.

Passes when your tests pass on your code and fail on chunk_local_mask. The
kill matrix (which mutants your tests caught) is printed and recorded.
"""
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import adapters
from stepkit import fail

STEP = 7
TIMEOUT_S = 300

SHIM = '''"""kv_cache for step 7: your kv_cache.py, with the mutant named by $KVKIT_MUTANT planted around it."""
import importlib.util as _util
import os as _os
import sys as _sys


def _load(_name, _path):
    _spec = _util.spec_from_file_location(_name, _path)
    _module = _util.module_from_spec(_spec)
    _sys.modules[_name] = _module
    _spec.loader.exec_module(_module)
    return _module


_real = _load("_kvkit_learner_kv_cache", {real!r})
globals().update({{_k: _v for _k, _v in vars(_real).items() if not (_k.startswith("__") and _k.endswith("__"))}})
if hasattr(_real, "__all__"):
    __all__ = list(_real.__all__)
MUTANT = _os.environ.get("KVKIT_MUTANT", "")
if MUTANT:
    _load("_kvkit_rules", {rules!r})  # the mask rule the planted masks are drawn from, read by mutants.py
    _mutants = _load("_kvkit_mutants", {mutants!r})
    KVCache, gqa_attention = _mutants.plant(MUTANT, _real.KVCache, _real.gqa_attention)
'''


def load_mutants(path: Path):
    """The catalogue's mutants module (PLANTED, kill_matrix), loaded from ``path``."""
    import importlib.util
    import sys

    if "_kvkit_rules" not in sys.modules:  # mutants.py reads the mask rule beside it, loaded first
        rules = importlib.util.spec_from_file_location("_kvkit_rules", path.with_name("rules.py"))
        sys.modules["_kvkit_rules"] = importlib.util.module_from_spec(rules)
        rules.loader.exec_module(sys.modules["_kvkit_rules"])
    spec = importlib.util.spec_from_file_location("_kvkit_mutants_list", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hypothesis_plugin(folder: Path) -> list[str]:
    """pytest's option that loads Hypothesis's plugin, when one of your files in ``folder`` imports
    Hypothesis and it is installed (read as syntax; the grader decides the same way); else none."""
    import ast
    import importlib.util

    for path in folder.glob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "hypothesis" for name in names) \
                    and importlib.util.find_spec("_hypothesis_pytestplugin"):
                return ["-p", "_hypothesis_pytestplugin"]
    return []


EXIT = {"pass": 0, "fail": 1}  # run_mine's outcome as pytest's exit code (anything else: not run)


def run_mine(mine: Path, shim_dir: Path, mutant: str) -> tuple[str, str]:
    """Run test_mine.py against ``mutant`` ('' for your own code): ``(outcome, summary)``.

    outcome is "pass" (pytest exit 0), "fail" (exit 1: a test failed), or
    "error: ..." (no tests, a crash, a timeout).
    """
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)  # options for plugins that are off (say, -n of xdist)
    # As the grader runs a candidate's tests: no installed pytest plugin but Hypothesis's, for tests that
    # import it. Scanning every installed plugin would cost each of the nine runs about half a second.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["KVKIT_MUTANT"] = mutant
    env["PYTHONPATH"] = os.pathsep.join([str(shim_dir), str(mine.parent)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *hypothesis_plugin(mine.parent),
           "--import-mode=append",
           "--rootdir", str(shim_dir), "-c", str(shim_dir / "pytest.ini"), "--tb=line", "-rfE", str(mine)]
    try:
        proc = subprocess.run(cmd, cwd=shim_dir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"error: still running after {TIMEOUT_S} s", ""
    lines = (proc.stdout + proc.stderr).splitlines()
    summary = "\n".join(line.replace(" ::", f" {mine.name}::") for line in lines
                        if line.startswith(("FAILED", "ERROR", "E  "))) or "\n".join(lines[-8:])
    if proc.returncode == 0:
        return "pass", summary
    if proc.returncode == 1:
        return "fail", summary
    if proc.returncode == 5:
        return "error: no tests collected", summary
    return f"error: pytest exit code {proc.returncode}", summary


def matrix_text(rows: dict, must: str) -> str:
    width = max(len(name) for name in rows)
    out = []
    for name, (outcome, _) in rows.items():
        if name == "your kv_cache.py":
            verdict = "passed (right)" if outcome == "pass" else f"FAILED: {outcome} (your tests fail on your code)"
        else:
            verdict = {"fail": "caught", "pass": "missed"}.get(outcome, outcome)
            if name == must:
                verdict += "  <- must be caught"
        out.append(f"  {name:<{width}}  {verdict}")
    return "\n".join(out)


def test_your_tests_catch_the_planted_mistakes(record_property):
    mine = adapters.own_tests()
    folder = adapters.impl_dir()
    if not mine.is_file():
        fail(f"there is no test_mine.py in {folder}. Write your own tests there: a direct reference "
             f"(a plain softmax per query over keys 0 .. its position) compared with gqa_attention on chunked inputs.")
    real = folder / "kv_cache.py"
    if not real.is_file():
        fail(f"there is no kv_cache.py in {folder} to run your tests against.")
    mutants = adapters.mutants_path()
    if mutants is None:
        fail("the planted mutants (catalogue/mutants.py) are not next to the exercises; step 7 needs them.")
    catalogue = load_mutants(mutants)
    planted = list(catalogue.PLANTED)
    with tempfile.TemporaryDirectory(prefix="kvkit-step7-") as tmp:
        shim_dir = Path(tmp)
        (shim_dir / "kv_cache.py").write_text(SHIM.format(real=str(real), mutants=str(mutants), rules=str(mutants.with_name("rules.py"))))
        (shim_dir / "pytest.ini").write_text("[pytest]\n")
        rows = {"your kv_cache.py": run_mine(mine, shim_dir, "")}
        if rows["your kv_cache.py"][0] != "pass":
            outcome, summary = rows["your kv_cache.py"]
            fail(f"your tests in {mine.name} do not pass on your own kv_cache.py ({outcome}); they must, before "
                 f"they can tell a planted mistake from it.\n{summary}")
        with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
            results = list(pool.map(lambda m: run_mine(mine, shim_dir, m), planted))
        rows.update(zip(planted, results))
    record_property("kill_matrix", json.dumps({name: outcome for name, (outcome, _) in rows.items()}))
    matrix = catalogue.kill_matrix({("none" if name == "your kv_cache.py" else name): EXIT.get(outcome)
                                    for name, (outcome, _) in rows.items()})
    text = matrix_text(rows, matrix["must_catch"])
    caught = matrix["caught"]
    print(f"\nkill matrix of {mine.name} ({len(caught)} of {len(planted)} planted mistakes caught):\n{text}")
    if not matrix["caught_must"]:
        must = matrix["must_catch"]
        fail(f"your tests in {mine.name} pass on the planted {must} (outcome: {rows[must][0]}): a mask "
             f"built from the chunk alone, right at T = 1 (decode) and T = S (full prefill), wrong only for a "
             f"chunk with 1 < T < S. Your tests need a call that appends such a chunk to a row that already holds "
             f"tokens, checked query by query against your reference.\nkill matrix "
             f"({len(caught)} of {len(planted)} caught):\n{text}")
