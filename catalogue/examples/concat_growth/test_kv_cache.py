import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def slow_attention(q, ks, vs, n_new):
    # ks[b]: [Hkv, L_b, d] everything stored for row b
    B, Hq, T, d = q.shape
    out = np.zeros_like(q)
    for b in range(B):
        Hkv, L, _ = ks[b].shape
        G = Hq // Hkv
        for h in range(Hq):
            K, V = ks[b][h // G], vs[b][h // G]
            for t in range(n_new[b]):
                p = L - n_new[b] + t
                s = K[:p + 1] @ q[b, h, t] / np.sqrt(d)
                e = np.exp(s - s.max())
                out[b, h, t] = (e / e.sum()) @ V[:p + 1]
    return out


def test_matches_slow_version_on_chunks():
    rng = np.random.default_rng(0)
    B, Hkv, G, d = 2, 2, 3, 4
    cache = KVCache(B, Hkv, 20, d, dtype=np.float64)
    ks = [np.zeros((Hkv, 0, d)) for _ in range(B)]
    vs = [np.zeros((Hkv, 0, d)) for _ in range(B)]
    for counts in ([4, 2], [3, 3], [1, 0], [1, 1]):
        T = max(counts)
        n = np.array(counts)
        k, v = rng.normal(size=(2, B, Hkv, T, d))
        q = rng.normal(size=(B, Hkv * G, T, d))
        cache.append(k, v, n)
        for b in range(B):
            ks[b] = np.concatenate([ks[b], k[b, :, :n[b]]], axis=1)
            vs[b] = np.concatenate([vs[b], v[b, :, :n[b]]], axis=1)
        np.testing.assert_allclose(gqa_attention(q, cache, n), slow_attention(q, ks, vs, n), atol=1e-10)


def test_overflow_raises():
    cache = KVCache(1, 1, 3, 2)
    cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    with pytest.raises(ValueError):
        cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    assert cache.lens.tolist() == [2]
