import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def reference(q, K, V, start, n):
    """One row. K, V: [Hkv, L, d]. Query t is at position start + t."""
    Hq = q.shape[0]
    K = np.tile(K, (Hq // K.shape[0], 1, 1))      # one KV head per query head
    V = np.tile(V, (Hq // V.shape[0], 1, 1))
    out = np.zeros_like(q)
    for h in range(Hq):
        for t in range(n):
            p = start + t
            s = K[h, :p + 1] @ q[h, t] / np.sqrt(q.shape[-1])
            w = np.exp(s - s.max())
            out[h, t] = (w / w.sum()) @ V[h, :p + 1]
    return out


@pytest.mark.parametrize("Hkv,Hq", [(1, 4), (2, 4), (2, 6), (4, 4)])
def test_chunks_match_reference(Hkv, Hq):
    rng = np.random.default_rng(Hq)
    d, steps = 4, [5, 3, 1, 1]
    cache = KVCache(1, Hkv, 16, d, dtype=np.float64)
    for n in steps:
        k = rng.standard_normal((1, Hkv, n, d))
        v = rng.standard_normal((1, Hkv, n, d))
        q = rng.standard_normal((1, Hq, n, d))
        cache.append(k, v, np.array([n]))
        L = cache.lens[0]
        got = gqa_attention(q, cache, np.array([n]))
        want = reference(q[0], cache.k[0, :, :L], cache.v[0, :, :L], L - n, n)
        np.testing.assert_allclose(got[0], want, atol=1e-10)


def test_overflow():
    cache = KVCache(2, 1, 2, 1)
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 3, 1)), np.ones((2, 1, 3, 1)), np.array([0, 3]))
    assert cache.lens.tolist() == [0, 0]
