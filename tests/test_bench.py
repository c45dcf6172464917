"""``kvkit bench``: it runs, writes every figure, and its one exact figure is exact.

No timing assertions: timings on a shared machine are figures to report, not to
test. What is tested is that the command runs end to end (``--quick``), that
its JSON holds every figure the issue names, and that the bytes the
concatenating cache copies, counted with tracemalloc, match the cost model's
formula within 1% (work, not time).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench
from benchmarks.concat import ConcatKVCache, bytes_per_token, measure_bytes_copied
from benchmarks.timing import interleaved
from solutions import cost

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):  # the tests that use it are marked slow: `make test-all` runs them
    """One ``kvkit bench --quick`` in a child process; its exit status, output and JSON."""
    out = tmp_path_factory.mktemp("bench-out")
    json_path = out / "figures.json"
    proc = subprocess.run([sys.executable, "-m", "kvkit.cli", "bench", "--quick", "--out", str(out),
                           "--json", str(json_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    data = json.loads(json_path.read_text()) if json_path.exists() else None
    return proc, out, data


@pytest.mark.slow
def test_quick_run_writes_every_figure(quick_run):
    proc, out, data = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data is not None, "no --json file written"
    for key in bench.REQUIRED_KEYS:
        assert key in data, f"{key} missing from the JSON"
    for key in bench.REQUIRED_KEYS:
        if key == "grade_seconds_per_submission" and data[key] is None:
            # The grader may be absent or failing: then the reason must be recorded.
            assert data.get("grade_error"), "grading figure is null without a reason"
            continue
        assert isinstance(data[key], (int, float)) and data[key] > 0, f"{key} = {data[key]!r}"
    assert (out / "bench.json").exists() and (out / "table.md").exists()
    for png in ("concat.png", "decode.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    assert "figure" in proc.stdout and "measured" in proc.stdout  # the rich table was printed
    assert set(data["targets"]) == set(bench.TARGETS)


@pytest.mark.slow
def test_quick_run_bytes_copied_match_formula(quick_run):
    _, _, data = quick_run
    assert data["concat_bytes_formula"] == cost.concat_bytes_copied(data["concat_n"], data["concat_bytes_per_token"])
    assert abs(data["concat_bytes_measured"] / data["concat_bytes_formula"] - 1) <= 0.01
    assert data["targets"]["concat_bytes_ratio"]["met"] is True


def test_bytes_copied_by_concatenation_match_the_cost_model():
    n = 512
    traced = measure_bytes_copied(n)
    per_token = bytes_per_token()
    assert traced["bytes_per_token"] == per_token == 2048
    assert traced["formula"][-1] == cost.concat_bytes_copied(n, per_token)
    measured, formula = traced["measured"][-1], traced["formula"][-1]
    assert formula <= measured <= formula * 1.01  # only array headers on top of the copied data
    # Every allocation is the grown array: existing tokens plus the new one.
    assert traced["allocated"][-1] - measured == n * per_token


def test_concat_cache_really_grows_by_copying():
    cache = ConcatKVCache(2, 2, 8)
    tok = np.ones((2, 2, 1, 8), np.float32)
    buffers = []
    for step in range(3):
        cache.append(tok * step, tok * -step)
        buffers.append(cache.k)
    assert cache.k.shape == (2, 2, 3, 8) and list(cache.lens) == [3, 3]
    assert len({id(b) for b in buffers}) == 3  # a new array every step
    assert cache.v[0, 0, :, 0].tolist() == [0, -1, -2]
    with pytest.raises(ValueError, match="k_new"):
        cache.append(np.ones((2, 3, 1, 8), np.float32), np.ones((2, 3, 1, 8), np.float32))


def test_interleaved_runs_each_variant_in_turn():
    calls = []
    result = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=4, warmup=1,
                         setup={"b": lambda: calls.append("setup")}, every={"b": 2})
    assert calls == ["a", "setup", "b", "a", "setup", "b", "a", "a", "setup", "b", "a"]
    assert len(result["a"].samples) == 4 and len(result["b"].samples) == 2
    assert result["a"].best == min(result["a"].samples)


def test_numpy_op_profile_sees_the_products_and_leaves_the_cache_alone():
    from benchmarks.opprofile import breakdown, profile_numpy
    from solutions import kv_cache as ref

    rng = np.random.default_rng(0)
    cache = ref.KVCache(2, 2, 32, 8)
    kv = rng.standard_normal((2, 2, 20, 8)).astype(np.float32)
    cache.append(kv, kv, np.array([20, 20]))
    q = rng.standard_normal((2, 8, 1, 8)).astype(np.float32)
    expected = ref.gqa_attention(q, cache, np.array([1, 1]))
    k_before = cache.k
    ops = profile_numpy(lambda: ref.gqa_attention(q, cache, np.array([1, 1])), cache, calls=2)
    assert cache.k is k_before and type(cache.k) is np.ndarray
    parts = breakdown(ops, live=20)
    assert parts["qk"] > 0 and parts["pv"] > 0
    np.testing.assert_array_equal(ref.gqa_attention(q, cache, np.array([1, 1])), expected)


def test_usage_errors_exit_2(capsys):
    assert bench.main(["--no-such-option"]) == 2
    assert bench.main(["--only", "concat,nonsense"]) == 2


def test_gpu_script_without_cuda_says_so_and_exits_0(tmp_path):
    from benchmarks import gpu_decode

    if gpu_decode.cuda_available():
        pytest.skip("a CUDA device is present: the script would measure")
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_decode.py"), "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA" in proc.stdout
    assert json.loads(out.read_text()) == {"cuda": False, "reason": "no CUDA device"}


def test_gpu_script_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_decode.py"), "--dry-run",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    for key in ("gpu_copy_bw_bytes_per_s", "gpu_decode_torch_seconds", "gpu_decode_torch_fraction_of_copy_bw",
                "gpu_decode_torch_vs_sdpa", "gpu_decode_repeat_vs_torch"):
        assert data[key] > 0
    assert data["gpu_outputs_max_abs_diff"] < 0.05  # bf16: the port, SDPA and repeat agree


def test_interleaved_budget_stops_after_min_rounds():
    result = interleaved({"a": lambda: None, "b": lambda: None}, rounds=50, budget_s=0.0, min_rounds=2)
    assert len(result["a"].samples) == len(result["b"].samples) == 2
