"""Tests against a direct loop reference: whole-prompt prefill, decode, ragged rows, padding; and the refusal."""
import math

import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference(q, rows_k, rows_v, n_new):
    """rows_k[b]: [Hkv, L_b, d], every token row b holds after the append."""
    B, Hq, T, d = q.shape
    out = np.zeros(q.shape)
    for b in range(B):
        K, V = rows_k[b], rows_v[b]
        L, G = K.shape[1], Hq // K.shape[0]
        for h in range(Hq):
            for t in range(int(n_new[b])):
                pos = L - n_new[b] + t
                s = K[h // G, :pos + 1] @ q[b, h, t] / math.sqrt(d)
                w = np.exp(s - s.max())
                out[b, h, t] = (w / w.sum()) @ V[h // G, :pos + 1]
    return out


def run(schedule, kv_heads, group, pad=0, d=6, seed=0):
    rng = np.random.default_rng(seed)
    B = len(schedule[0])
    cache = KVCache(B, kv_heads, 32, d, dtype=np.float64)
    rows_k = [np.zeros((kv_heads, 0, d)) for _ in range(B)]
    rows_v = [np.zeros((kv_heads, 0, d)) for _ in range(B)]
    for counts in schedule:
        n_new = np.array(counts)
        T = max(counts) + pad
        k, v = rng.standard_normal((2, B, kv_heads, T, d))
        q = rng.standard_normal((B, kv_heads * group, T, d))
        cache.append(k, v, n_new)
        for b in range(B):
            rows_k[b] = np.concatenate([rows_k[b], k[b, :, :counts[b]]], 1)
            rows_v[b] = np.concatenate([rows_v[b], v[b, :, :counts[b]]], 1)
        out = gqa_attention(q, cache, n_new)
        np.testing.assert_allclose(out, reference(q, rows_k, rows_v, n_new), atol=1e-10)
        for b in range(B):
            assert not out[b, :, counts[b]:].any()          # padded slots are exact zeros


@pytest.mark.parametrize("kv_heads,group", [(1, 4), (2, 2), (4, 1), (2, 3)])
def test_prefill_then_decode(kv_heads, group):
    run([[6, 6], [1, 1], [1, 1]], kv_heads, group)


def test_ragged_rows_padding_and_idle_rows():
    run([[5, 2, 0], [1, 1, 3], [0, 1, 1], [1, 0, 1]], kv_heads=2, group=2, pad=2, seed=1)


def test_chunked_prefill_is_refused_and_changes_nothing():
    cache = KVCache(1, 1, 8, 2, dtype=np.float64)
    cache.append(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)), np.array([3]))
    with pytest.raises(NotImplementedError):
        cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    assert cache.lens.tolist() == [3]
