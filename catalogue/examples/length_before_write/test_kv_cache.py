import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def ref_attention(q, K, V, start):
    # q [Hq, n, d]; K, V [Hkv, L, d]; query t at position start + t
    Hq, n, d = q.shape
    G = Hq // K.shape[0]
    res = np.zeros_like(q)
    for h in range(Hq):
        for t in range(n):
            sc = K[h // G, :start + t + 1] @ q[h, t] / np.sqrt(d)
            w = np.exp(sc - sc.max())
            res[h, t] = (w / w.sum()) @ V[h // G, :start + t + 1]
    return res


@pytest.mark.parametrize("Hkv,G", [(1, 1), (1, 3), (2, 2), (4, 2)])
def test_prefill_chunk_decode(Hkv, G):
    rng = np.random.default_rng(Hkv + G)
    d = 4
    cache = KVCache(2, Hkv, 16, d, dtype=np.float64)
    for counts in ([5, 2], [3, 3], [1, 1], [0, 1]):
        n = np.array(counts)
        T = int(n.max())
        k, v, = rng.standard_normal((2, 2, Hkv, T, d))
        q = rng.standard_normal((2, Hkv * G, T, d))
        cache.append(k, v, n)
        out = gqa_attention(q, cache, n)
        for b in range(2):
            L = int(cache.lens[b])
            want = ref_attention(q[b, :, :n[b]], cache.k[b, :, :L], cache.v[b, :, :L], L - n[b])
            np.testing.assert_allclose(out[b, :, :n[b]], want, atol=1e-10)
            assert np.all(out[b, :, n[b]:] == 0)


def test_overflow_raises():
    cache = KVCache(1, 1, 4, 2)
    cache.append(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)), np.array([3]))
    with pytest.raises(ValueError, match="row 0"):
        cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
