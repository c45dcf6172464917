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
def quick_run(tmp_path_factory):  # the tests that use it are marked slow: `make test-slow` (and CI) runs them
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


def test_gpu_script_without_cuda_says_so_and_exits_0(tmp_path, capsys):
    from benchmarks import gpu_decode

    if gpu_decode.cuda_available():
        pytest.skip("a CUDA device is present: the script would measure")
    out = tmp_path / "gpu.json"
    # In this process (torch is already here): the dry run below runs the script as a program.
    assert gpu_decode.main(["--json", str(out)]) == 0
    assert "no CUDA" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {"cuda": False, "reason": "no CUDA device"}


@pytest.mark.slow  # the whole GPU script on the CPU (make test-slow); its no-CUDA path runs in make test
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


# --- benchmarks/tuned.py: the tuned copies against the float64 oracle (no timing) -------------------

def _tuned_protocol(rng, B, T_max):
    """A random protocol of ``(T, n_new)`` steps: full prefill, an equal-rows decode (the unmasked
    path), chunked and ragged prefill with zero-token rows, ragged decode, padded slots."""
    yield T_max, [T_max] * B  # full prefill, every row the same length
    yield 1, [1] * B  # decode, equal rows: no mask needed
    for _ in range(4):
        T = int(rng.integers(1, T_max + 1))
        n = rng.integers(0, T + 1, size=B)
        n[rng.integers(B)] = 0  # a row with no new token
        yield T, [int(x) for x in n]  # chunked prefill with ragged rows and padding
    yield 1, [1 if b % 2 else 0 for b in range(B)]  # ragged decode, half the rows idle
    yield 3, [1] * B  # decode with two padded slots per row


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2), (6, 1), (12, 4)])
@pytest.mark.parametrize("workspace", [None, 20_000, 1])  # default; a few slots per chunk; one, unkept
def test_tuned_attention_matches_the_float64_oracle(backend, dtype, hq, hkv, workspace):
    import torch

    from benchmarks.tuned import tuned_numpy, tuned_torch
    from grader.stages.oracle import attention_ref
    from solutions import kv_cache as ref
    from solutions import kv_cache_torch as port

    rng = np.random.default_rng(hash((backend, dtype, hq, hkv, workspace)) % 2**32)
    B, d, T_max = 3, 8, 6
    kw = {} if workspace is None else {"workspace_bytes": workspace}
    if backend == "numpy":
        cache = ref.KVCache(B, hkv, 48, d, dtype=np.dtype(dtype))
    else:
        cache = port.KVCache(B, hkv, 48, d, dtype=getattr(torch, dtype))
    tol = 1e-5 if dtype == "float32" else 1e-12
    for T, n in _tuned_protocol(rng, B, T_max):
        k_new, v_new = (rng.standard_normal((B, hkv, T, d)).astype(dtype) for _ in range(2))
        q = rng.standard_normal((B, hq, T, d)).astype(dtype)
        if backend == "numpy":
            cache.append(k_new, v_new, np.array(n))
            out = tuned_numpy(q, cache, np.array(n), **kw)
            k, v, lens = cache.k, cache.v, cache.lens
        else:
            cache.append(torch.from_numpy(k_new), torch.from_numpy(v_new), torch.tensor(n))
            out = tuned_torch(torch.from_numpy(q), cache, torch.tensor(n), **kw)
            assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype)
            out = out.numpy()
            k, v, lens = cache.k.numpy(), cache.v.numpy(), cache.lens.numpy()
        expected = attention_ref(q, k, v, lens, np.array(n))
        assert out.shape == (B, hq, T, d) and out.dtype == np.dtype(dtype)
        assert not np.isnan(out).any()
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol, err_msg=f"T={T} n_new={n} lens={list(lens)}")
        for b in range(B):
            assert (out[b, :, n[b]:] == 0).all(), f"padded slots of row {b} are not exactly 0"


def test_tuned_plan_skips_the_mask_only_when_it_hides_nothing_and_trims_keys():
    from benchmarks.tuned import Chunk, plan

    assert plan([9, 9], [1, 1], 1, 100, 1000) == [Chunk(0, 1, 9, False)]  # decode, equal rows
    assert plan([9, 5], [1, 1], 1, 100, 1000) == [Chunk(0, 1, 9, True)]  # ragged: row 1 must not see keys 5..8
    assert plan([9, 9], [1, 0], 2, 100, 1000) == [Chunk(0, 2, 9, False)]  # slot 1 and row 1 are padding only
    # A full prefill of 6 cut into chunks of 2 slots: each reads only the keys its last query sees.
    assert plan([6], [6], 6, 100, 200) == [Chunk(0, 2, 2, True), Chunk(2, 4, 4, True), Chunk(4, 6, 6, True)]
    assert plan([4, 4], [0, 0], 3, 100, 1000) == []


def test_tuned_edge_cases_and_errors():
    import torch

    from benchmarks.tuned import tuned_numpy, tuned_torch
    from solutions import kv_cache as ref
    from solutions import kv_cache_torch as port

    for B, T, fill in ((0, 1, 0), (2, 0, 3), (2, 2, 0)):
        c, ct = ref.KVCache(B, 2, 8, 4), port.KVCache(B, 2, 8, 4)
        if fill:
            c.append(np.ones((B, 2, fill, 4), np.float32), np.ones((B, 2, fill, 4), np.float32), np.full(B, fill))
            ct.append(torch.ones(B, 2, fill, 4), torch.ones(B, 2, fill, 4), torch.full((B,), fill))
        n = np.zeros(B, dtype=np.int64)
        out = tuned_numpy(np.ones((B, 4, T, 4), np.float32), c, n)
        assert out.shape == (B, 4, T, 4) and not out.any()
        out_t = tuned_torch(torch.ones(B, 4, T, 4), ct, torch.from_numpy(n))
        assert out_t.shape == (B, 4, T, 4) and not out_t.any()
    c, ct = ref.KVCache(2, 2, 8, 4), port.KVCache(2, 2, 8, 4)
    c.append(np.ones((2, 2, 2, 4), np.float32), np.ones((2, 2, 2, 4), np.float32), np.array([2, 1]))
    ct.append(torch.ones(2, 2, 2, 4), torch.ones(2, 2, 2, 4), torch.tensor([2, 1]))
    for fn, cache, arr in ((tuned_numpy, c, np.ones), (tuned_torch, ct, torch.ones)):
        with pytest.raises(ValueError, match="Hq"):
            fn(arr((2, 3, 1, 4)), cache, [1, 1])
        with pytest.raises(ValueError, match="n_new"):
            fn(arr((2, 4, 1, 4)), cache, [2, 0])  # outside 0..T
        with pytest.raises(ValueError, match="lens"):
            fn(arr((2, 4, 2, 4)), cache, [2, 2])  # row 1 holds one token
        with pytest.raises(ValueError, match="q must be"):
            fn(arr((2, 4, 1, 5)), cache, [1, 1])
        with pytest.raises(TypeError, match="n_new"):
            fn(arr((2, 4, 1, 4)), cache, np.array([1.0, 1.0]))


def test_tuned_output_is_never_the_kept_buffer_and_bf16_is_close():
    import torch

    from benchmarks.tuned import tuned_numpy, tuned_torch
    from solutions import kv_cache as ref
    from solutions import kv_cache_torch as port

    rng = np.random.default_rng(3)
    kv = rng.standard_normal((2, 2, 10, 8)).astype(np.float32)
    c, ct = ref.KVCache(2, 2, 16, 8), port.KVCache(2, 2, 16, 8)
    c.append(kv, kv, np.array([10, 10]))
    ct.append(torch.from_numpy(kv), torch.from_numpy(kv), torch.tensor([10, 10]))
    q1, q2 = (rng.standard_normal((2, 4, 1, 8)).astype(np.float32) for _ in range(2))
    ones = np.array([1, 1])
    for fn, wrap in ((tuned_numpy, np.asarray), (tuned_torch, torch.from_numpy)):
        first = fn(wrap(q1), c if fn is tuned_numpy else ct, ones)
        kept = first.clone() if isinstance(first, torch.Tensor) else first.copy()
        fn(wrap(q2), c if fn is tuned_numpy else ct, ones)
        np.testing.assert_array_equal(np.asarray(first), np.asarray(kept))  # the second call did not overwrite the first
    cb = port.KVCache(2, 2, 16, 8, dtype=torch.bfloat16)
    cb.append(torch.from_numpy(kv).bfloat16(), torch.from_numpy(kv).bfloat16(), torch.tensor([10, 7]))
    qb = torch.from_numpy(rng.standard_normal((2, 4, 3, 8)).astype(np.float32)).bfloat16()
    out = tuned_torch(qb, cb, torch.tensor([3, 2]))
    from grader.stages.oracle import attention_ref

    expected = attention_ref(qb.float().numpy(), cb.k.float().numpy(), cb.v.float().numpy(), [10, 7], [3, 2])
    assert out.dtype == torch.bfloat16 and (out[1, :, 2] == 0).all()
    np.testing.assert_allclose(out.float().numpy(), expected, atol=0.05)


def test_bench_decode_figures_carry_the_tuned_copies(monkeypatch):
    """The decode figure at a toy size (seconds, not minutes): its JSON keys, table rows and notes."""
    from benchmarks import decode

    monkeypatch.setattr(decode, "SETTLE_SECONDS", 0.0)
    toy = decode.DecodeShape(batch=2, kv_heads=2, group=2, head_dim=8, live=16, max_len=32)
    assert decode.outputs_agree(decode.build(toy)) < 1e-5
    r = decode.decode_figures(toy, rounds=2, read_bytes=2**20, profile_calls=1)
    for key in ("decode_tuned_torch_fraction_of_read_bw", "decode_tuned_torch_vs_sdpa",
                "decode_tuned_numpy_fraction_of_read_bw", "decode_tuned_torch_vs_torch",
                "decode_tuned_numpy_vs_numpy", "decode_tuned_torch_fraction_of_read_bw_round_median"):
        assert r[key] > 0, key
    assert set(r["decode_profile"]) == {"numpy", "torch", "tuned_numpy", "tuned_torch"}
    status = bench.target_status(r)
    rows = bench.table_rows(r, status)
    text = "\n".join(" | ".join(row) for row in rows)
    assert "tuned (benchmarks/tuned.py) beside the reading copy" in text
    assert "SDPA enable_gqa time / tuned PyTorch time" in text
    assert any(line.startswith("Tuned PyTorch decode step") for line in bench.notes(r, status))
