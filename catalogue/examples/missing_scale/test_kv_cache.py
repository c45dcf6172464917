import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def attention_ref(q, k, v):
    """Reference causal attention over a full sequence, one head at a time."""
    T = q.shape[0]
    s = q @ k.T
    s[np.triu_indices(T, 1)] = -np.inf
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


@pytest.mark.parametrize("Hkv,G", [(1, 4), (2, 2), (4, 1)])
def test_chunked_matches_full_sequence(Hkv, G):
    rng = np.random.default_rng(0)
    d, total = 4, 10
    k = rng.standard_normal((1, Hkv, total, d))
    v = rng.standard_normal((1, Hkv, total, d))
    q = rng.standard_normal((1, Hkv * G, total, d))
    cache = KVCache(1, Hkv, 16, d, dtype=np.float64)
    got = np.zeros_like(q)
    pos = 0
    for n in (5, 3, 1, 1):
        cache.append(k[:, :, pos:pos + n], v[:, :, pos:pos + n], np.array([n]))
        got[:, :, pos:pos + n] = gqa_attention(q[:, :, pos:pos + n], cache, np.array([n]))
        pos += n
    for h in range(Hkv * G):
        want = attention_ref(q[0, h], k[0, h // G], v[0, h // G])
        np.testing.assert_allclose(got[0, h], want, atol=1e-10)


def test_overflow_raises_and_keeps_lens():
    cache = KVCache(2, 1, 3, 2)
    cache.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 0]))
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 1]))
    assert list(cache.lens) == [2, 0]
