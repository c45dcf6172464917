import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def brute_force(q, k, v, first_pos):
    """q: [Hq, T, d], k/v: [Hkv, L, d]; query t sits at first_pos + t."""
    Hq, T, d = q.shape
    G = Hq // k.shape[0]
    out = np.zeros_like(q)
    for h in range(Hq):
        for t in range(T):
            p = first_pos + t
            s = k[h // G, :p + 1] @ q[h, t] / np.sqrt(d)
            w = np.exp(s - s.max())
            out[h, t] = w @ v[h // G, :p + 1] / w.sum()
    return out


@pytest.mark.parametrize("Hkv,G", [(1, 4), (2, 2), (4, 1), (2, 4)])
def test_batch_prefill_chunk_decode(Hkv, G):
    rng = np.random.default_rng(7)
    B, d = 3, 4
    cache = KVCache(B, Hkv, 16, d, dtype=np.float64)
    for T in (5, 3, 1, 1):
        k = rng.standard_normal((B, Hkv, T, d))
        v = rng.standard_normal((B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        n = np.full(B, T)
        cache.append(k, v, n)
        out = gqa_attention(q, cache, n)
        L = int(cache.lens[0])
        for b in range(B):
            want = brute_force(q[b], cache.k[b, :, :L], cache.v[b, :, :L], L - T)
            np.testing.assert_allclose(out[b], want, atol=1e-10)


def test_overflow_is_atomic():
    cache = KVCache(2, 1, 4, 2)
    cache.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 2]))
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([1, 3]))
    assert cache.lens.tolist() == [2, 2]
