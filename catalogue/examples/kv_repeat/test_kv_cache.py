import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def naive(q, keys, values, n_new):
    """keys[b] is [L_b, Hkv, d] in append order."""
    B, Hq, T, d = q.shape
    res = np.zeros(q.shape)
    for b in range(B):
        L = len(keys[b])
        for h in range(Hq):
            kvh = h // (Hq // keys[b].shape[1]) if L else 0
            for t in range(n_new[b]):
                last = L - n_new[b] + t
                s = np.array([q[b, h, t] @ keys[b][j, kvh] for j in range(last + 1)]) / np.sqrt(d)
                w = np.exp(s - s.max())
                w /= w.sum()
                res[b, h, t] = sum(w[j] * values[b][j, kvh] for j in range(last + 1))
    return res


@pytest.mark.parametrize("Hkv,G", [(1, 3), (2, 2), (3, 1)])
def test_against_naive(Hkv, G):
    rng = np.random.default_rng(Hkv * 10 + G)
    B, d = 2, 4
    c = KVCache(B, Hkv, 16, d, dtype=np.float64)
    keys = [np.zeros((0, Hkv, d)) for _ in range(B)]
    vals = [np.zeros((0, Hkv, d)) for _ in range(B)]
    for counts in ([5, 3], [3, 1], [1, 1], [0, 2]):
        n = np.array(counts)
        T = n.max()
        k = rng.standard_normal((B, Hkv, T, d))
        v = rng.standard_normal((B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        c.append(k, v, n)
        for b in range(B):
            keys[b] = np.concatenate([keys[b], k[b, :, :n[b]].transpose(1, 0, 2)])
            vals[b] = np.concatenate([vals[b], v[b, :, :n[b]].transpose(1, 0, 2)])
        out = gqa_attention(q, c, n)
        np.testing.assert_allclose(out, naive(q, keys, vals, n), atol=1e-10)


def test_overflow_leaves_cache_alone():
    c = KVCache(2, 1, 4, 2)
    c.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([1, 3]))
    with pytest.raises(ValueError):
        c.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 2]))
    assert c.lens.tolist() == [1, 3]
    assert c.k[0, 0, 1:].sum() == 0
