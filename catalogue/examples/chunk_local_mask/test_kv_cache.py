import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def full_causal_attention(q, k, v):
    """Plain MHA-style reference for a whole sequence. q: [Hq, T, d], k/v: [Hkv, T, d]."""
    Hq, T, d = q.shape
    G = Hq // k.shape[0]
    k = np.repeat(k, G, axis=0)
    v = np.repeat(v, G, axis=0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    return softmax(s) @ v


@pytest.mark.parametrize("Hkv,G", [(1, 2), (2, 2), (2, 1), (4, 3)])
def test_prefill_matches_reference(Hkv, G):
    rng = np.random.default_rng(0)
    T, d = 6, 8
    cache = KVCache(1, Hkv, 10, d, dtype=np.float64)
    k, v = rng.normal(size=(2, 1, Hkv, T, d))
    q = rng.normal(size=(1, Hkv * G, T, d))
    cache.append(k, v, np.array([T]))
    out = gqa_attention(q, cache, np.array([T]))
    np.testing.assert_allclose(out[0], full_causal_attention(q[0], k[0], v[0]), atol=1e-10)


def test_decode_matches_reference():
    rng = np.random.default_rng(1)
    Hkv, G, d = 2, 2, 4
    cache = KVCache(1, Hkv, 10, d, dtype=np.float64)
    k, v = rng.normal(size=(2, 1, Hkv, 7, d))
    cache.append(k[:, :, :4], v[:, :, :4], np.array([4]))
    for t in range(4, 7):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1], np.array([1]))
        q = rng.normal(size=(1, Hkv * G, 1, d))
        out = gqa_attention(q, cache, np.array([1]))
        # the decode query is the last position of a full sequence
        q_full = np.zeros((Hkv * G, t + 1, d))
        q_full[:, -1] = q[0, :, 0]
        want = full_causal_attention(q_full, k[0, :, :t + 1], v[0, :, :t + 1])[:, -1]
        np.testing.assert_allclose(out[0, :, 0], want, atol=1e-10)


def test_padding_rows_are_zero():
    cache = KVCache(2, 1, 8, 2)
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([3, 0]))
    out = gqa_attention(np.ones((2, 2, 3, 2), np.float32), cache, np.array([3, 0]))
    assert np.all(out[1] == 0) and np.isfinite(out).all()


def test_overflow():
    cache = KVCache(1, 1, 4, 2)
    with pytest.raises(ValueError):
        cache.append(np.ones((1, 1, 5, 2)), np.ones((1, 1, 5, 2)), np.array([5]))
