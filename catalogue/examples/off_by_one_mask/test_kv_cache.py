import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


def test_shapes_and_dtype():
    cache = KVCache(2, 2, 8, 4)
    cache.append(np.ones((2, 2, 3, 4)), np.ones((2, 2, 3, 4)), np.array([3, 2]))
    out = gqa_attention(np.ones((2, 6, 3, 4), np.float32), cache, np.array([3, 2]))
    assert out.shape == (2, 6, 3, 4)
    assert out.dtype == np.float32
    assert np.all(out[1, :, 2] == 0)


def test_decode_against_numpy():
    rng = np.random.default_rng(0)
    Hkv, G, d = 2, 3, 4
    cache = KVCache(1, Hkv, 12, d, dtype=np.float64)
    ks, vs = [], []
    for step in range(6):
        k = rng.standard_normal((1, Hkv, 1, d))
        v = rng.standard_normal((1, Hkv, 1, d))
        q = rng.standard_normal((1, Hkv * G, 1, d))
        cache.append(k, v, np.array([1]))
        ks.append(k[0, :, 0])
        vs.append(v[0, :, 0])
        K = np.stack(ks, 1)
        V = np.stack(vs, 1)
        out = gqa_attention(q, cache, np.array([1]))
        for h in range(Hkv * G):
            s = K[h // G] @ q[0, h, 0] / np.sqrt(d)
            p = np.exp(s - s.max())
            p /= p.sum()
            np.testing.assert_allclose(out[0, h, 0], p @ V[h // G], atol=1e-10)


def test_overflow():
    cache = KVCache(2, 1, 3, 2)
    with pytest.raises(ValueError):
        cache.append(np.ones((2, 1, 4, 2)), np.ones((2, 1, 4, 2)), np.array([1, 4]))
    assert cache.lens.tolist() == [0, 0]
