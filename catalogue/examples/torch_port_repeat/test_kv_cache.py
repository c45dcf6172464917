import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def direct(q_tok, keys, values, d):
    """One query vector against keys/values [n, d] (everything it may see)."""
    s = keys @ q_tok / np.sqrt(d)
    w = np.exp(s - s.max())
    return (w / w.sum()) @ values


def run(schedule, Hkv, G, d=4, seed=0):
    rng = np.random.default_rng(seed)
    B = len(schedule[0])
    cache = KVCache(B, Hkv, 32, d, dtype=np.float64)
    seen_k = [np.zeros((0, Hkv, d)) for _ in range(B)]
    seen_v = [np.zeros((0, Hkv, d)) for _ in range(B)]
    for counts in schedule:
        n = np.array(counts)
        T = max(1, n.max())
        k_new = rng.standard_normal((B, Hkv, T, d))
        v_new = rng.standard_normal((B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        cache.append(k_new, v_new, n)
        for b in range(B):
            seen_k[b] = np.concatenate([seen_k[b], k_new[b, :, :n[b]].swapaxes(0, 1)])
            seen_v[b] = np.concatenate([seen_v[b], v_new[b, :, :n[b]].swapaxes(0, 1)])
        out = gqa_attention(q, cache, n)
        expected = np.zeros_like(q)
        for b in range(B):
            K = np.repeat(seen_k[b], G, axis=1)            # [L, Hq, d]
            V = np.repeat(seen_v[b], G, axis=1)
            L = len(K)
            for h in range(Hkv * G):
                for t in range(n[b]):
                    p = L - n[b] + t
                    expected[b, h, t] = direct(q[b, h, t], K[:p + 1, h], V[:p + 1, h], d)
        np.testing.assert_allclose(out, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("Hkv,G", [(1, 3), (2, 2), (4, 1), (2, 3)])
def test_chunked_prefill(Hkv, G):
    run([[5], [3], [1], [1]], Hkv, G)


def test_ragged():
    run([[4, 1], [2, 3], [0, 1], [1, 0], [3, 2]], 2, 2, seed=1)


def test_overflow():
    cache = KVCache(2, 1, 4, 1)
    cache.append(np.ones((2, 1, 3, 1)), np.ones((2, 1, 3, 1)), np.array([3, 1]))
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 2, 1)), np.ones((2, 1, 2, 1)), np.array([2, 1]))
    assert cache.lens.tolist() == [3, 1]
    assert np.all(cache.k[1, 0, 1:] == 0)
