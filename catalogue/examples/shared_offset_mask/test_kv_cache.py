"""Checks against a loop reference: prefill, a chunk after cached tokens, decode (a batch of equal rows)."""
import math

import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference(q, keys, values, n_new):
    """q [B, Hq, T, d]; keys/values[b]: [Hkv, L, d], every token of row b so far."""
    B, Hq, T, d = q.shape
    out = np.zeros(q.shape)
    for b in range(B):
        K, V = keys[b], values[b]
        L, G = K.shape[1], Hq // K.shape[0]
        for h in range(Hq):
            for t in range(n_new[b]):
                pos = L - n_new[b] + t
                s = K[h // G, :pos + 1] @ q[b, h, t] / math.sqrt(d)
                w = np.exp(s - s.max())
                out[b, h, t] = (w / w.sum()) @ V[h // G, :pos + 1]
    return out


@pytest.mark.parametrize("kv_heads,group", [(1, 4), (2, 2), (4, 1), (2, 3)])
def test_prefill_chunk_decode(kv_heads, group):
    rng = np.random.default_rng(kv_heads * 10 + group)
    B, d = 2, 8
    cache = KVCache(B, kv_heads, 24, d, dtype=np.float64)
    keys = np.zeros((B, kv_heads, 0, d))
    values = np.zeros((B, kv_heads, 0, d))
    for T in (5, 3, 1, 4, 1):
        k = rng.standard_normal((B, kv_heads, T, d))
        v = rng.standard_normal((B, kv_heads, T, d))
        q = rng.standard_normal((B, kv_heads * group, T, d))
        n_new = np.full(B, T)
        cache.append(k, v, n_new)
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        out = gqa_attention(q, cache, n_new)
        np.testing.assert_allclose(out, reference(q, keys, values, n_new), atol=1e-10)


def test_overflow_raises_and_changes_nothing():
    cache = KVCache(2, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([3, 3]))
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 2]))
    assert cache.lens.tolist() == [3, 3]
