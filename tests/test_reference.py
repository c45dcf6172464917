"""The NumPy reference and the PyTorch port against the direct oracle, on the spec's protocol."""
from __future__ import annotations

import math
import tracemalloc
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from grader.inprocess import meters
from grader.stages.oracle import ReferenceHistory
from grader.stages.suite import random_trials
from solutions import kv_cache as ref


# torch is imported by the tests of the port, not here: every pytest-xdist worker imports every test
# module to collect it, and torch costs about 2 CPU-s a process.
@pytest.fixture(scope="module")
def port():
    """The PyTorch port (solutions/kv_cache_torch.py); it imports torch."""
    from solutions import kv_cache_torch

    return kv_cache_torch


def replay(trials, run_step):
    """Feed every step of ``trials`` to ``run_step(cache_state, step)``; return the worst error against the oracle."""
    worst = 0.0
    for trial in trials:
        cache = ref.KVCache(trial.B, trial.Hkv, trial.max_len, trial.d, dtype=np.float64)
        history = ReferenceHistory(trial.B, trial.Hkv, trial.d)
        for step in trial.steps:
            cache.append(step.k_new, step.v_new, step.n_new)
            history.append(step.k_new, step.v_new, step.n_new)
            got = run_step(cache, step)
            worst = max(worst, float(np.abs(got - history.expected(step.q, step.n_new)).max(initial=0.0)))
    return worst


def test_numpy_reference_matches_oracle_on_200_random_trials():
    trials = random_trials(seed=2024, count=200)
    kinds = {"decode": 0, "chunk": 0, "zero_row": 0}
    for trial in trials:
        lens = np.zeros(trial.B, dtype=int)
        for step in trial.steps:
            lens += step.n_new
            kinds["decode"] += step.q.shape[2] == 1
            kinds["chunk"] += bool(((step.n_new > 1) & (step.n_new < lens)).any())
            kinds["zero_row"] += bool((step.n_new == 0).any())
    assert all(kinds.values()), f"the protocol must exercise decode, T < S and zero-token rows: {kinds}"
    with np.errstate(all="raise"):
        worst = replay(trials, lambda cache, step: ref.gqa_attention(step.q, cache, step.n_new))
    assert worst <= 1e-10, f"max abs error {worst:.3g} against the oracle"


@st.composite
def histories(draw):
    Hkv = draw(st.sampled_from([1, 2, 4]))
    G = draw(st.integers(1, 8))
    B = draw(st.integers(1, 3))
    d = draw(st.sampled_from([1, 2, 4, 8]))
    chunks = draw(st.lists(st.tuples(st.integers(1, 8), st.lists(st.integers(0, 8), min_size=B, max_size=B)),
                           min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**16))
    return Hkv, G, B, d, [(T, [min(n, T) for n in counts]) for T, counts in chunks], seed


@settings(max_examples=60, deadline=None)
@given(histories())
def test_numpy_reference_property(history):
    """Any history of chunks (lengths up to 48, zero-token rows, padding) matches the oracle; shrinks on failure."""
    Hkv, G, B, d, chunks, seed = history
    rng = np.random.default_rng(seed)
    max_len = sum(T for T, _ in chunks)
    cache = ref.KVCache(B, Hkv, max_len, d, dtype=np.float64)
    oracle = ReferenceHistory(B, Hkv, d)
    for T, counts in chunks:
        k, v = rng.standard_normal((2, B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        cache.append(k, v, np.array(counts))
        oracle.append(k, v, np.array(counts))
        with np.errstate(all="raise"):
            got = ref.gqa_attention(q, cache, np.array(counts))
        np.testing.assert_allclose(got, oracle.expected(q, np.array(counts)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("B,T,fill", [(0, 3, []), (2, 3, [0, 0]), (2, 0, [3, 1])])
def test_empty_batch_empty_cache_and_no_slots_give_zeros(B, T, fill):
    cache = ref.KVCache(B, 2, 8, 4, dtype=np.float64)
    if B and any(fill):
        cache.append(np.ones((B, 2, 3, 4)), np.ones((B, 2, 3, 4)), np.array(fill))
    n_new = np.zeros(B, dtype=np.int64)
    cache.append(np.ones((B, 2, T, 4)), np.ones((B, 2, T, 4)), n_new)
    with np.errstate(all="raise"):
        out = ref.gqa_attention(np.ones((B, 4, T, 4)), cache, n_new)
    assert out.shape == (B, 4, T, 4) and not out.any()


@pytest.mark.parametrize("lens_before,n_new", [([3, 6], [2, 3]), ([7, 1], [2, 2])])
def test_overflow_raises_and_changes_nothing(lens_before, n_new):
    cache = ref.KVCache(2, 1, 8, 4, dtype=np.float64)
    rng = np.random.default_rng(0)
    for b, n in enumerate(lens_before):
        counts = np.zeros(2, dtype=np.int64)
        counts[b] = n
        cache.append(rng.standard_normal((2, 1, n, 4)), rng.standard_normal((2, 1, n, 4)), counts)
    k, v, lens = cache.k.copy(), cache.v.copy(), cache.lens.copy()
    with pytest.raises(ValueError, match="overflow row"):
        cache.append(rng.standard_normal((2, 1, 4, 4)), rng.standard_normal((2, 1, 4, 4)), np.array(n_new))
    assert (cache.lens == lens).all() and (cache.k == k).all() and (cache.v == v).all()


def test_buffers_are_never_replaced_and_attention_copies_no_kv():
    cache = ref.KVCache(2, 2, 600, 64, dtype=np.float32)
    k0, v0 = cache.k, cache.v
    rng = np.random.default_rng(1)
    for n in (300, 7, 1, 1, 200):
        chunk = rng.standard_normal((2, 2, n, 64)).astype(np.float32)
        cache.append(chunk, chunk, np.full(2, n))
    assert cache.k is k0 and cache.v is v0
    q = rng.standard_normal((2, 16, 1, 64)).astype(np.float32)
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    ref.gqa_attention(q, cache, np.ones(2, dtype=np.int64))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    live = 2 * cache.k[:, :, :509].nbytes
    # Slices of the buffers are views: attention allocates scores, not K/V (a repeat is G = 8 times live).
    assert peak < 0.5 * live, f"attention allocated {peak} B against {live} B of live K/V"


@pytest.mark.parametrize("call,match", [
    (lambda c: ref.gqa_attention(np.ones((2, 3, 1, 4)), c, np.array([1, 1])), "Hq=3"),
    (lambda c: ref.gqa_attention(np.ones((3, 4, 1, 4)), c, np.array([1, 1])), r"q must be \[B, Hq, T, d\]"),
    (lambda c: ref.gqa_attention(np.ones((2, 4, 1, 4)), c, np.array([1, 1, 1])), "n_new must have shape"),
    (lambda c: ref.gqa_attention(np.ones((2, 4, 2, 4)), c, np.array([3, 1])), r"n_new\[0\]=3 is outside"),
    (lambda c: ref.gqa_attention(np.ones((2, 4, 4, 4)), c, np.array([4, 1])), r"holds only lens\[0\]=2"),
    (lambda c: c.append(np.ones((2, 3, 1, 4)), np.ones((2, 3, 1, 4)), np.array([1, 1])), r"k_new must be"),
    (lambda c: c.append(np.ones((2, 2, 1, 4)), np.ones((2, 2, 2, 4)), np.array([1, 1])), r"v_new must have"),
    (lambda c: c.append(np.ones((2, 2, 1, 4)), np.ones((2, 2, 1, 4)), np.array([1.0, 1.0])), r"n_new must hold integers"),
    (lambda c: c.append(np.ones((2, 2, 1, 4)), np.ones((2, 2, 1, 4)), np.array([-1, 1])), r"n_new\[0\]=-1"),
])
def test_bad_input_names_the_argument_and_changes_nothing(call, match):
    cache = ref.KVCache(2, 2, 8, 4, dtype=np.float64)
    cache.append(np.ones((2, 2, 2, 4)), np.ones((2, 2, 2, 4)), np.array([2, 2]))
    lens, k = cache.lens.copy(), cache.k.copy()
    with pytest.raises((ValueError, TypeError), match=match):
        call(cache)
    assert (cache.lens == lens).all() and (cache.k == k).all()


def test_constructor_rejects_bad_sizes(port):
    with pytest.raises(ValueError, match="kv_heads"):
        ref.KVCache(1, 0, 8, 4)
    with pytest.raises(ValueError, match="max_len"):
        port.KVCache(1, 1, -1, 4)


# ------------------------------------------------------------------- the port

@pytest.mark.parametrize("dtype_name,tol", [("float64", 1e-10), ("float32", 1e-5)])
def test_port_matches_numpy_reference(port, dtype_name, tol):
    import torch

    dtype, np_dtype = getattr(torch, dtype_name), getattr(np, dtype_name)
    worst = 0.0
    for trial in random_trials(seed=7, count=30):
        a = ref.KVCache(trial.B, trial.Hkv, trial.max_len, trial.d, dtype=np_dtype)
        b = port.KVCache(trial.B, trial.Hkv, trial.max_len, trial.d, dtype=dtype)
        for step in trial.steps:
            k, v, q = (x.astype(np_dtype) for x in (step.k_new, step.v_new, step.q))
            a.append(k, v, step.n_new)
            b.append(torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(step.n_new))
            want = ref.gqa_attention(q, a, step.n_new)
            got = port.gqa_attention(torch.from_numpy(q), b, torch.from_numpy(step.n_new))
            assert got.dtype == dtype and not torch.isnan(got).any()
            worst = max(worst, float(np.abs(got.numpy() - want).max(initial=0.0)))
    assert worst <= tol, f"port differs from the NumPy reference by {worst:.3g}"


def test_port_runs_no_concat_and_no_repeat(port):
    import torch

    ops = meters.probe_torch_ops(port, torch)
    names = {op[0] for op in ops["append_ops"] + ops["attention_ops"]}
    assert not names & {"cat", "stack", "repeat_interleave", "repeat"}, names
    assert ops["same_objects"] and ops["same_storage"]
    assert meters.judge_torch_ops(ops) == {}


def _broadcasting_matmul_attention(q, cache, n_new):
    """The trap of docs/contract.md: right answer, but torch.matmul expands K over the group axis."""
    import torch

    B, Hkv, _, d = cache.k.shape
    Hq, T = q.shape[1], q.shape[2]
    G, S = Hq // Hkv, int(cache.lens.max())
    k, v = cache.k[:, :, :S], cache.v[:, :, :S]
    scores = q.view(B, Hkv, G, T, d) @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(d)
    return (torch.softmax(scores, -1) @ v.unsqueeze(2)).reshape(B, Hq, T, d)


def test_op_watch_catches_the_broadcasting_matmul_trap(port):
    import torch

    mod = types.SimpleNamespace(KVCache=port.KVCache, gqa_attention=_broadcasting_matmul_attention)
    named = meters.judge_torch_ops(meters.probe_torch_ops(mod, torch))
    assert "kv_repeat" in named and "clone" in named["kv_repeat"], named


def test_op_watch_catches_repeat_interleave_and_cat(port):
    import torch

    class CatCache(port.KVCache):
        def append(self, k_new, v_new, n_new):
            super().append(k_new, v_new, n_new)
            self.k = torch.cat([self.k[:, :, :0], self.k], dim=2)

    def repeat_attention(q, cache, n_new):
        G = q.shape[1] // cache.k.shape[1]
        S = int(cache.lens.max())
        k = cache.k[:, :, :S].repeat_interleave(G, dim=1)
        v = cache.v[:, :, :S].repeat_interleave(G, dim=1)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v

    named = meters.judge_torch_ops(meters.probe_torch_ops(
        types.SimpleNamespace(KVCache=CatCache, gqa_attention=repeat_attention), torch))
    assert set(named) == {"concat_growth", "kv_repeat"}, named
