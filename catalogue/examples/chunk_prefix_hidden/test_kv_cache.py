import math

import numpy as np

from kv_cache import KVCache, gqa_attention


def naive(q, k, v):
    """One row: q [Hq, T, d] are the last T positions of k/v [Hkv, L, d]."""
    Hq, T, d = q.shape
    L, G = k.shape[1], Hq // k.shape[0]
    out = np.zeros(q.shape)
    for h in range(Hq):
        for t in range(T):
            pos = L - T + t
            s = k[h // G, :pos + 1] @ q[h, t] / math.sqrt(d)
            w = np.exp(s - s.max())
            out[h, t] = w / w.sum() @ v[h // G, :pos + 1]
    return out


def test_prompt_then_tokens():
    rng = np.random.default_rng(0)
    Hkv, G, d = 2, 3, 4
    cache = KVCache(1, Hkv, 12, d, dtype=np.float64)
    k, v = rng.normal(size=(2, 1, Hkv, 9, d))
    q = rng.normal(size=(1, Hkv * G, 6, d))
    cache.append(k[:, :, :6], v[:, :, :6], np.array([6]))
    np.testing.assert_allclose(gqa_attention(q, cache, np.array([6]))[0], naive(q[0], k[0, :, :6], v[0, :, :6]),
                               atol=1e-10)
    for t in range(6, 9):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1], np.array([1]))
        q1 = rng.normal(size=(1, Hkv * G, 1, d))
        want = naive(q1[0], k[0, :, :t + 1], v[0, :, :t + 1])
        np.testing.assert_allclose(gqa_attention(q1, cache, np.array([1]))[0], want, atol=1e-10)
