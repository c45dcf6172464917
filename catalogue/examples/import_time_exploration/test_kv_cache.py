"""My tests: compare against a slow, obviously-correct reference on chunked input.

The reference does not look at the cache at all: it keeps its own list of every
token appended to each row, repeats KV heads the naive way, and runs a plain
softmax for each query over keys 0 .. its absolute position.
"""
import math

import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference(q, history_k, history_v, n_new):
    """q: [B, Hq, T, d]; history_*[b]: list of [Hkv, d] tokens of row b (after append)."""
    B, Hq, T, d = q.shape
    out = np.zeros((B, Hq, T, d))
    for b in range(B):
        L = len(history_k[b])
        if L == 0:
            continue
        K = np.stack(history_k[b], axis=1)          # [Hkv, L, d]
        V = np.stack(history_v[b], axis=1)
        G = Hq // K.shape[0]
        K = np.repeat(K, G, axis=0)                 # [Hq, L, d]
        V = np.repeat(V, G, axis=0)
        for h in range(Hq):
            for t in range(n_new[b]):
                pos = L - n_new[b] + t
                s = K[h, :pos + 1] @ q[b, h, t] / math.sqrt(d)
                w = np.exp(s - s.max())
                w /= w.sum()
                out[b, h, t] = w @ V[h, :pos + 1]
    return out


def run_schedule(schedule, kv_heads, group, d=8, max_len=32, pad=0, seed=0):
    """Feed `schedule` (a list of per-row token counts) and check every step."""
    rng = np.random.default_rng(seed)
    B = len(schedule[0])
    cache = KVCache(B, kv_heads, max_len, d, dtype=np.float64)
    hist_k = [[] for _ in range(B)]
    hist_v = [[] for _ in range(B)]
    for step in schedule:
        n_new = np.array(step, dtype=np.int64)
        T = int(n_new.max()) + pad
        k_new = rng.standard_normal((B, kv_heads, T, d))
        v_new = rng.standard_normal((B, kv_heads, T, d))
        q = rng.standard_normal((B, kv_heads * group, T, d))
        cache.append(k_new, v_new, n_new)
        for b in range(B):
            for t in range(n_new[b]):
                hist_k[b].append(k_new[b, :, t])
                hist_v[b].append(v_new[b, :, t])
        out = gqa_attention(q, cache, n_new)
        assert out.shape == q.shape and out.dtype == q.dtype
        expected = reference(q, hist_k, hist_v, n_new)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-10,
                                   err_msg=f"step {step} (lens now {cache.lens.tolist()})")
        for b in range(B):                           # padded query slots are exact zeros
            assert np.all(out[b, :, n_new[b]:] == 0.0)
    return cache


@pytest.mark.parametrize("kv_heads,group", [(2, 3), (1, 4), (4, 1), (4, 2)])
def test_prefill_then_chunk_then_decode(kv_heads, group):
    # 5 tokens, then a chunk of 3 (T=3 < S=8), then three decode steps.
    run_schedule([[5], [3], [1], [1], [1]], kv_heads, group)


def test_ragged_rows_with_padding_and_idle_rows():
    # rows of different lengths, padded slots, and rows that get nothing in a step
    schedule = [[5, 2, 0], [3, 4, 1], [1, 0, 6], [0, 1, 1], [2, 2, 0]]
    run_schedule(schedule, kv_heads=2, group=2, pad=2, seed=1)


def test_head_h_reads_kv_head_h_div_g():
    # Hkv = 4 = G would hide an `h % Hkv` mapping only if Hkv or G were 1
    run_schedule([[4, 3], [2, 1], [1, 1]], kv_heads=4, group=4, seed=2)


def test_float32_close_to_reference():
    rng = np.random.default_rng(3)
    cache = KVCache(1, 2, 16, 4)                    # float32 by default
    assert cache.k.dtype == np.float32
    k = rng.standard_normal((1, 2, 6, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 6, 4)).astype(np.float32)
    cache.append(k[:, :, :4], v[:, :, :4], np.array([4]))
    cache.append(k[:, :, 4:], v[:, :, 4:], np.array([2]))
    q = rng.standard_normal((1, 4, 2, 4)).astype(np.float32)
    out = gqa_attention(q, cache, np.array([2]))
    assert out.dtype == np.float32
    hist_k = [[k[0, :, t].astype(np.float64) for t in range(6)]]
    hist_v = [[v[0, :, t].astype(np.float64) for t in range(6)]]
    np.testing.assert_allclose(out, reference(q.astype(np.float64), hist_k, hist_v, [2]), atol=1e-5)


def test_writes_in_place():
    cache = KVCache(2, 1, 8, 2, dtype=np.float64)
    k_buf, v_buf = cache.k, cache.v
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([3, 1]))
    cache.append(2 * np.ones((2, 1, 2, 2)), 2 * np.ones((2, 1, 2, 2)), np.array([1, 2]))
    assert cache.k is k_buf and cache.v is v_buf
    assert cache.lens.tolist() == [4, 3] and cache.lens.dtype == np.int64
    assert cache.k[0, 0, :, 0].tolist() == [1, 1, 1, 2, 0, 0, 0, 0]
    assert cache.k[1, 0, :, 0].tolist() == [1, 2, 2, 0, 0, 0, 0, 0]


def test_overflow_changes_nothing():
    rng = np.random.default_rng(4)
    cache = KVCache(2, 2, 6, 4, dtype=np.float64)
    cache.append(rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 4)), np.array([2, 5]))
    before_k, before_v, before_lens = cache.k.copy(), cache.v.copy(), cache.lens.copy()
    with pytest.raises(ValueError, match="row 1"):
        # row 0 fits (2 + 2 <= 6), row 1 does not (5 + 2 > 6)
        cache.append(rng.standard_normal((2, 2, 2, 4)), rng.standard_normal((2, 2, 2, 4)), np.array([2, 2]))
    np.testing.assert_array_equal(cache.lens, before_lens)
    np.testing.assert_array_equal(cache.k, before_k)
    np.testing.assert_array_equal(cache.v, before_v)


def test_empty_inputs_give_zeros():
    cache = KVCache(0, 2, 4, 3)
    assert gqa_attention(np.zeros((0, 4, 2, 3), np.float32), cache, np.zeros(0, np.int64)).shape == (0, 4, 2, 3)
    cache = KVCache(2, 2, 4, 3)
    out = gqa_attention(np.ones((2, 4, 2, 3), np.float32), cache, np.array([0, 0]))
    assert out.shape == (2, 4, 2, 3) and np.all(out == 0)
    assert gqa_attention(np.ones((2, 4, 0, 3), np.float32), cache, np.array([0, 0])).shape == (2, 4, 0, 3)


def test_no_floating_point_warnings():
    with np.errstate(all="raise"):
        run_schedule([[3, 0], [0, 2], [1, 1]], kv_heads=1, group=2, pad=1, seed=5)


def test_bad_shapes_are_named():
    cache = KVCache(1, 2, 4, 3)
    with pytest.raises(ValueError, match="q"):
        gqa_attention(np.zeros((1, 3, 1, 3)), cache, np.array([0]))    # 3 heads, Hkv = 2
    with pytest.raises(ValueError, match="k_new"):
        cache.append(np.zeros((1, 2, 1, 5)), np.zeros((1, 2, 1, 5)), np.array([1]))
    with pytest.raises(ValueError, match="n_new"):
        cache.append(np.zeros((1, 2, 1, 3)), np.zeros((1, 2, 1, 3)), np.array([2]))
