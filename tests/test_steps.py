"""The learner's step tests (exercises/tests/), run the way a learner runs them.

Each step's tests run with pytest in their own process, through the seam
``exercises/tests/adapters.py`` (``$KVKIT_IMPL`` picks the code):

* against the reference (solutions/ plus a test_mine.py that compares with a
  direct reference on chunked inputs): every step passes;
* against the stubs in exercises/: every step fails, and its first failure
  names the step;
* against known mistakes (planted around the reference with
  catalogue.mutants.plant, or small PyTorch variants written here): the step
  that should catch each one fails, and its message names the mistake.

What ``kvkit progress`` shows for a fresh copy and for one filled with the
reference is checked here too, on the same step runs (test_progress.py covers
the rest of the command). The helpers here (``fresh_copy``, ``filled_dir``,
``GOOD_TEST_MINE``) are also used by test_progress.py and test_starter.py.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvkit import progress

KIT = Path(__file__).resolve().parent.parent
EXERCISES = KIT / "exercises"
SOLUTIONS = KIT / "solutions"
STEPS = progress.load_steps(EXERCISES)
BY_NUMBER = {s.number: s for s in STEPS}

# Own tests as a strong candidate writes them: a direct reference (plain lists
# of tokens, a loop per query) compared on chunked, ragged, padded schedules.
GOOD_TEST_MINE = '''"""My tests: gqa_attention against a direct reference, on chunked inputs."""
import math

import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference(q, keys, values, n_new):
    B, Hq, T, d = q.shape
    out = np.zeros((B, Hq, T, d))
    for b in range(B):
        total = len(keys[b])
        for h in range(Hq):
            for t in range(int(n_new[b])):
                last = total - int(n_new[b]) + t
                heads = len(keys[b][0])
                K = np.array([keys[b][p][h * heads // Hq] for p in range(last + 1)])
                V = np.array([values[b][p][h * heads // Hq] for p in range(last + 1)])
                s = K @ q[b, h, t] / math.sqrt(d)
                w = np.exp(s - s.max())
                out[b, h, t] = (w / w.sum()) @ V
    return out


SCHEDULES = [
    ([[4], [3], [1], [1]], 2, 2, 0),
    ([[3, 0, 2], [2, 4, 0], [1, 1, 1], [0, 2, 3]], 2, 3, 1),
]


@pytest.mark.parametrize("schedule,Hkv,G,pad", SCHEDULES)
def test_chunked_schedule_matches_reference(schedule, Hkv, G, pad):
    rng = np.random.default_rng(0)
    B, d = len(schedule[0]), 4
    cache = KVCache(B, Hkv, 16, d, dtype=np.float64)
    keys, values = [[] for _ in range(B)], [[] for _ in range(B)]
    for step in schedule:
        n_new = np.array(step, dtype=np.int64)
        T = int(n_new.max()) + pad
        k = rng.standard_normal((B, Hkv, T, d))
        v = rng.standard_normal((B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        before = np.array(cache.lens, copy=True)
        buffer = cache.k
        cache.append(k, v, n_new)
        assert cache.k is buffer
        assert cache.lens.tolist() == (before + n_new).tolist()
        for b in range(B):
            for t in range(step[b]):
                keys[b].append(k[b, :, t])
                values[b].append(v[b, :, t])
        out = gqa_attention(q, cache, n_new)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, reference(q, keys, values, n_new), atol=1e-10)


def test_overflow_changes_nothing():
    cache = KVCache(2, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([1, 3]))
    before = np.array(cache.lens, copy=True)
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 2]))
    assert cache.lens.tolist() == before.tolist()
'''

# The tests a candidate writes when they only think of decode and a full prefill.
WEAK_TEST_MINE = GOOD_TEST_MINE.replace(
    "    ([[4], [3], [1], [1]], 2, 2, 0),\n    ([[3, 0, 2], [2, 4, 0], [1, 1, 1], [0, 2, 3]], 2, 3, 1),\n",
    "    ([[4], [1], [1]], 2, 2, 0),\n    ([[6], [1]], 1, 3, 0),\n")


def fresh_copy(target: Path) -> Path:
    """A copy of exercises/ as a learner gets it (the stubs, the step tests, steps.toml)."""
    shutil.copytree(EXERCISES, target, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    return target


def filled_dir(target: Path, test_mine: str = GOOD_TEST_MINE) -> Path:
    """``target`` holding the reference's three files and ``test_mine``: what a learner has at the end."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("kv_cache.py", "kv_cache_torch.py", "cost.py"):
        shutil.copyfile(SOLUTIONS / name, target / name)
    (target / "test_mine.py").write_text(test_mine)
    return target


_RESULTS: dict = {}


def run(step: int, impl: Path, again: bool = False) -> progress.Result:
    """Step ``step``'s tests against the code in ``impl`` (one pytest process; remembered unless ``again``)."""
    key = (step, str(impl))
    if again or key not in _RESULTS:
        _RESULTS[key] = progress.run_step(BY_NUMBER[step], EXERCISES, impl=impl)
    return _RESULTS[key]


@pytest.fixture(autouse=True)
def quick_pytest(monkeypatch):
    """No pytest plugins in the step runs, step 7's runs of test_mine.py included: half the start-up time."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("KVKIT_IMPL", raising=False)



def test_steps_toml_lists_seven_steps_each_with_a_one_sentence_goal_and_hints():
    """What a step says to the learner. That steps.toml's numbers, files, needs and mistake ids agree with the
    kit is ``kvkit check-kit``'s (grader/batch/check_kit.py ``check_steps``; tests/test_check_kit.py)."""
    assert len(STEPS) == 7
    for step in STEPS:
        one_sentence = step.goal.endswith(".") and "\n" not in step.goal and not re.search(r"\.\s+[A-Z]", step.goal)
        assert one_sentence, f"step {step.number}'s goal is not one sentence: {step.goal}"
        assert len(step.hints) >= 2, f"step {step.number} needs at least two hints"
        assert step.fills


def rendered(results: list, folder: Path, prog: str) -> str:
    """What ``kvkit progress`` prints for ``results`` (plain text, one line per line)."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=400, soft_wrap=True, color_system=None)
    progress.render(results, folder, progress.Out(console), prog)
    return console.file.getvalue()


def test_the_reference_passes_every_step_and_progress_says_all_done(tmp_path):
    """A fresh copy of exercises/ filled with the reference: every step done, and step 7's kill matrix read back."""
    folder = filled_dir(fresh_copy(tmp_path / "exercises"))
    results = progress.run_all(STEPS, folder, jobs=1)
    for step, result in zip(STEPS, results):
        assert result.status == "done", f"step {step.number} on the reference: {result.check}\n{result.failure}"
        assert result.passed >= 1
    import json

    from catalogue.mutants import PLANTED as planted
    matrix = json.loads(results[-1].properties["kill_matrix"])
    assert matrix["your kv_cache.py"] == "pass" and matrix["chunk_local_mask"] == "fail"
    assert matrix["concat_growth"] == "fail"  # GOOD_TEST_MINE checks `cache.k is buffer` after each append
    assert set(planted) <= set(matrix)
    out = rendered(results, folder, "kvkit progress")
    assert "All 7 steps done." in out and "pending" not in out
    assert "planted mistakes" in out  # step 7's kill matrix, read back from the report


def test_the_kill_matrix_shows_once_step_7_is_done_even_with_step_6_pending(tmp_path):
    """A take-home's port (step 6) is optional: step 7's matrix is read back all the same."""
    import json

    matrix = {"your kv_cache.py": "pass", "chunk_local_mask": "fail", "missing_scale": "pass"}
    results = [progress.Result(step, "done", passed=1) for step in STEPS]
    results[5] = progress.Result(STEPS[5], "pending", failure="step 6: no port yet")
    results[6].properties = {"kill_matrix": json.dumps(matrix)}
    out = rendered(results, tmp_path, "kvkit progress")
    assert "<- you are here" in next(line for line in out.splitlines() if "step 6  " in line)
    assert "Your own tests caught 1 of 2 planted mistakes; they miss: missing_scale." in out, out


def test_the_stubs_fail_every_step_naming_it_and_progress_points_at_step_1(tmp_path):
    """A fresh copy of exercises/: every step pending, its first failure naming the step; step 1 is current."""
    folder = fresh_copy(tmp_path / "exercises")
    for step in STEPS:  # each step on its own, as `python -m pytest tests/test_stepN_*.py` runs it
        result = progress.run_step(step, folder)
        assert result.status == "pending", f"step {step.number} passed on the stubs"
        assert result.failure.startswith(f"step {step.number}:"), result.failure
        assert "not written yet" in result.failure or "NotImplementedError" in result.failure, result.failure
    # What progress runs: step 1, then only the steps that do not build on it (the cost model, the port).
    results = progress.run_all(STEPS, folder, jobs=1)
    ran = {r.step.number for r in results if not r.stopped}
    assert ran == {1, 5, 6}, [(r.step.number, r.failure) for r in results]
    assert all(r.waits_for == 1 for r in results if r.step.number not in ran)
    assert "not written yet" in results[0].failure
    out = rendered(results, folder, f"kvkit progress --dir {folder}")
    lines = out.splitlines()
    for step in STEPS:
        row = next(line for line in lines if f"step {step.number}  " in line)
        assert "pending" in row and "done" not in row, row
    assert "<- you are here" in next(line for line in lines if "step 1  " in line)
    assert f"Goal: {STEPS[0].goal}" in out
    assert "First failing check: test_step1_cache.py::" in out
    assert "step 1: KVCache.__init__ (kv_cache.py, line" in out and "NotImplementedError" in out
    # the commands it suggests act on the folder it was given, not on the default one
    flat = " ".join(out.split())
    assert f"kvkit progress --dir {folder} --watch" in flat and f"kvkit hint --dir {folder}" in flat, out


PLANTED = {  # mistake id: the step that must catch it first
    "length_before_write": 1,
    "concat_growth": 1,
    "modulo_head_mapping": 2,
    "missing_scale": 2,
    "chunk_local_mask": 3,
    "off_by_one_mask": 3,
    "ragged_keys_unmasked": 4,
    "ragged_keys_unmasked/batch_mask": 4,
    "nan_padding": 4,
}

PLANTED_KV_CACHE = '''from catalogue.mutants import plant
from solutions.kv_cache import KVCache as _KVCache, gqa_attention as _gqa_attention

KVCache, gqa_attention = plant({mistake!r}, _KVCache, _gqa_attention)
'''

REPEAT_KV_CACHE = '''import numpy as np
from solutions.kv_cache import KVCache, gqa_attention as _gqa_attention


def gqa_attention(q, cache, n_new):
    """Right answers, by repeating K and V out to all Hq heads first."""
    group = np.asarray(q).shape[1] // cache.k.shape[1]
    wide = KVCache.__new__(KVCache)
    wide.k, wide.v = np.repeat(cache.k, group, axis=1), np.repeat(cache.v, group, axis=1)
    wide.lens = cache.lens
    return _gqa_attention(q, wide, n_new)
'''


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_the_step_that_should_catch_a_mistake_names_it(mistake, tmp_path):
    (tmp_path / "kv_cache.py").write_text(PLANTED_KV_CACHE.format(mistake=mistake))
    step = PLANTED[mistake]
    earlier = run(step - 1, tmp_path) if step > 2 else None  # steps 1-2 only use the reference's KVCache
    result = run(step, tmp_path)
    assert result.status == "pending", f"step {step} did not catch {mistake}"
    assert mistake.split("/")[0] in result.failure, result.failure
    assert result.failure.startswith(f"step {step}:"), result.failure
    if earlier is not None:
        assert earlier.status == "done", f"{mistake} should get past step {step - 1}: {earlier.failure}"


def test_step_2_catches_a_materialised_repeat(tmp_path):
    (tmp_path / "kv_cache.py").write_text(REPEAT_KV_CACHE)
    result = run(2, tmp_path)
    assert result.status == "pending"
    assert "kv_repeat" in result.failure and "G=16" in result.failure, result.failure


def test_step_3_message_says_which_keys_the_query_saw(tmp_path):
    (tmp_path / "kv_cache.py").write_text(PLANTED_KV_CACHE.format(mistake="chunk_local_mask"))
    failure = run(3, tmp_path).failure
    assert "query 0 of the chunk (absolute position 4) saw keys 0..0 but should see keys 0..4" in failure, failure
    assert "n_new=[3]" in failure and "T=3" in failure and "lens after it=[7]" in failure, failure
    # The picture: each query of the chunk, the keys it saw (top-left) beside the keys it should see.
    assert "keys seen by each query of this call (row 0, query head 0)" in failure, failure
    assert "#......      #####.." in failure and "###....      #######" in failure, failure


# Small PyTorch ports, each right in its answers but making one mistake step 6 must see.
TORCH_PORT = '''import math

import torch
from solutions.kv_cache_torch import KVCache as _KVCache, gqa_attention as _gqa_attention

MODE = {mode!r}


class KVCache(_KVCache):
    def append(self, k_new, v_new, n_new):
        if MODE != "cat":
            return super().append(k_new, v_new, n_new)
        super().append(k_new, v_new, n_new)
        self.k = torch.cat([self.k[:, :, :0], self.k], dim=2)  # regrown: a new tensor each call
        self.v = torch.cat([self.v[:, :, :0], self.v], dim=2)


def gqa_attention(q, cache, n_new):
    _gqa_attention(q, cache, n_new)  # the reference's input checks
    B, Hkv, _, d = cache.k.shape
    Hq, T = q.shape[1], q.shape[2]
    G = Hq // Hkv
    n_new = torch.as_tensor(n_new, device=q.device)
    out = torch.zeros_like(q)
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return out
    k, v = cache.k[:, :, :S], cache.v[:, :, :S]
    t = torch.arange(T, device=q.device)
    if MODE == "top_left" and T > 1:
        pos = t[None, :].expand(B, T)  # the chunk's own positions: is_causal=True
    else:
        pos = (cache.lens - n_new)[:, None] + t
    visible = (torch.arange(S, device=q.device) <= pos[:, :, None]) & (t[None, :] < n_new[:, None])[:, :, None]
    visible = visible[:, None, None]
    if MODE == "broadcast":
        scores = q.view(B, Hkv, G, T, d) @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(d)
    else:
        scores = (q.reshape(B, Hkv, G * T, d) @ k.transpose(-1, -2)).view(B, Hkv, G, T, S) / math.sqrt(d)
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).masked_fill(~visible, 0.0)
    return (weights.reshape(B, Hkv, G * T, S) @ v).reshape(B, Hq, T, d)
'''


@pytest.mark.parametrize("mode,mistake,evidence", [
    ("broadcast", "kv_repeat", "aten.clone"),
    # Each run starts torch in a step process of its own: one port mutant in every `make test`, the
    # others in `make test-slow`.
    pytest.param("cat", "concat_growth", "aten.cat", marks=pytest.mark.slow),
    pytest.param("top_left", "chunk_local_mask", "should see keys 0..", marks=pytest.mark.slow),
])
def test_step_6_watches_the_ops_of_the_torch_port(mode, mistake, evidence, tmp_path):
    (tmp_path / "kv_cache_torch.py").write_text(TORCH_PORT.format(mode=mode))
    result = run(6, tmp_path)
    assert result.status == "pending", f"step 6 passed a port with {mistake}"
    assert mistake in result.failure and evidence in result.failure, result.failure


def test_step_7_fails_tests_that_miss_chunk_local_mask(tmp_path):
    filled_dir(tmp_path, WEAK_TEST_MINE)
    result = run(7, tmp_path)
    assert result.status == "pending"
    assert "chunk_local_mask" in result.failure and "missed" in result.failure, result.failure
    assert "kill matrix" in result.failure


def test_step_7_loads_hypothesis_plugin_only_for_tests_that_import_hypothesis(tmp_path, monkeypatch):
    """As the grader's sandbox does (tests/test_owntests.py): the learner's files, read as syntax."""
    import importlib.util

    monkeypatch.syspath_prepend(str(EXERCISES / "tests"))
    spec = importlib.util.spec_from_file_location("_step7", EXERCISES / "tests" / "test_step7_own_tests.py")
    step7 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step7)
    filled_dir(tmp_path)
    assert step7.hypothesis_plugin(tmp_path) == []
    (tmp_path / "test_mine.py").write_text(GOOD_TEST_MINE.replace(
        "import pytest\n", "import pytest\nfrom hypothesis import given, strategies as st\n", 1))
    assert step7.hypothesis_plugin(tmp_path) == ["-p", "_hypothesis_pytestplugin"]


def test_step_7_wants_a_test_mine(tmp_path):
    filled_dir(tmp_path).joinpath("test_mine.py").unlink()
    result = run(7, tmp_path)
    assert result.status == "pending" and "no test_mine.py" in result.failure, result.failure


def test_a_crash_in_the_learners_code_is_reported_with_its_line(tmp_path):
    source = (SOLUTIONS / "kv_cache.py").read_text().replace(
        "    out = np.zeros(q.shape, dtype=q.dtype)\n", "    out = np.zeros(q.shape, dtype=q.dtype)\n    out[99]\n", 1)
    assert "out[99]" in source
    (tmp_path / "kv_cache.py").write_text(source)
    failure = run(2, tmp_path).failure
    assert failure.startswith("step 2: gqa_attention (kv_cache.py, line") and "IndexError" in failure, failure
    assert "`out[99]`" in failure and "while running" in failure, failure


def test_a_syntax_error_is_reported_plainly(tmp_path):
    (tmp_path / "kv_cache.py").write_text("class KVCache:\n    def __init__(self\n")
    failure = run(1, tmp_path).failure
    assert failure.startswith("step 1: importing") and "SyntaxError" in failure, failure


def test_tests_that_miss_concat_growth_get_the_way_to_catch_it(tmp_path):
    """Step 7 passes with tests that never check the buffers stay the same objects; progress names
    concat_growth among the misses with the steps.toml advice (keep cache.k before an append, check `is` after)."""
    mine = GOOD_TEST_MINE.replace("        assert cache.k is buffer\n", "")
    assert mine != GOOD_TEST_MINE
    result = run(7, filled_dir(tmp_path, mine))
    assert result.status == "done", result.failure
    import json

    matrix = json.loads(result.properties["kill_matrix"])
    assert matrix["concat_growth"] == "pass", matrix  # missed
    results = [progress.Result(step, "done", passed=1) for step in STEPS]
    results[-1] = result
    out = rendered(results, tmp_path, "kvkit progress")
    assert "they miss: " in out and "concat_growth" in out.split("they miss: ")[1].splitlines()[0], out
    assert f"  concat_growth: {BY_NUMBER[7].missed['concat_growth']}" in out
