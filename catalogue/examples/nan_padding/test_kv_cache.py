import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference_row(q, K, V, n):
    """q: [Hq, n, d] for the last n tokens of a row whose keys are K, V: [Hkv, L, d]."""
    Hq, _, d = q.shape
    Hkv, L, _ = K.shape
    K = np.repeat(K, Hq // Hkv, axis=0)
    V = np.repeat(V, Hq // Hkv, axis=0)
    out = np.empty_like(q)
    for h in range(Hq):
        for t in range(n):
            p = L - n + t
            s = K[h, :p + 1] @ q[h, t] / np.sqrt(d)
            e = np.exp(s - s.max())
            out[h, t] = e @ V[h, :p + 1] / e.sum()
    return out


def test_ragged_chunks_real_tokens():
    rng = np.random.default_rng(3)
    B, Hkv, G, d = 3, 2, 2, 4
    cache = KVCache(B, Hkv, 20, d, dtype=np.float64)
    for counts in ([4, 1, 2], [3, 3, 1], [1, 1, 1], [2, 1, 3]):
        n = np.array(counts)
        T = n.max()
        k, v = rng.standard_normal((2, B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        cache.append(k, v, n)
        out = gqa_attention(q, cache, n)
        for b in range(B):
            L = cache.lens[b]
            want = reference_row(q[b, :, :n[b]], cache.k[b, :, :L], cache.v[b, :, :L], n[b])
            np.testing.assert_allclose(out[b, :, :n[b]], want, atol=1e-10)


def test_overflow_does_not_write():
    cache = KVCache(2, 1, 2, 1)
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 3, 1)), np.ones((2, 1, 3, 1)), np.array([1, 3]))
    assert cache.lens.tolist() == [0, 0] and not cache.k.any()
