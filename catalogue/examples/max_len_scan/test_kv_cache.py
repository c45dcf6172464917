"""Tests against a naive per-query reference, on chunked and ragged input."""
import numpy as np
import pytest

from kv_cache import KVCache, gqa_attention


class Reference:
    """Keeps the full token history of each row and attends naively."""

    def __init__(self, batch):
        self.keys = [[] for _ in range(batch)]
        self.values = [[] for _ in range(batch)]

    def append(self, k_new, v_new, n_new):
        for b, n in enumerate(n_new):
            for t in range(n):
                self.keys[b].append(k_new[b, :, t])
                self.values[b].append(v_new[b, :, t])

    def attend(self, q, n_new):
        B, Hq, T, d = q.shape
        out = np.zeros((B, Hq, T, d))
        for b in range(B):
            L = len(self.keys[b])
            if n_new[b] == 0:
                continue
            K = np.repeat(np.array(self.keys[b]).transpose(1, 0, 2), Hq // self.keys[b][0].shape[0], axis=0)
            V = np.repeat(np.array(self.values[b]).transpose(1, 0, 2), Hq // self.values[b][0].shape[0], axis=0)
            for h in range(Hq):
                for t in range(n_new[b]):
                    upto = L - n_new[b] + t + 1
                    s = K[h, :upto] @ q[b, h, t] / np.sqrt(d)
                    p = np.exp(s - s.max())
                    out[b, h, t] = (p / p.sum()) @ V[h, :upto]
        return out


def check(steps, Hkv, G, d=4, max_len=24, extra_pad=0, seed=0):
    rng = np.random.default_rng(seed)
    B = len(steps[0])
    cache, ref = KVCache(B, Hkv, max_len, d, dtype=np.float64), Reference(B)
    for counts in steps:
        n = np.array(counts, dtype=np.int64)
        T = int(n.max()) + extra_pad
        k, v = rng.standard_normal((2, B, Hkv, T, d))
        q = rng.standard_normal((B, Hkv * G, T, d))
        cache.append(k, v, n)
        ref.append(k, v, n)
        got = gqa_attention(q, cache, n)
        np.testing.assert_allclose(got, ref.attend(q, n), rtol=0, atol=1e-10, err_msg=f"after {counts}")


@pytest.mark.parametrize("Hkv,G", [(1, 1), (1, 5), (3, 1), (2, 4), (4, 2)])
def test_prefill_chunk_decode_one_row(Hkv, G):
    check([[5], [3], [1], [1]], Hkv, G)


def test_ragged_batch_with_idle_rows_and_padding():
    check([[6, 1, 0], [2, 3, 4], [0, 1, 1], [1, 0, 1], [3, 3, 0]], 2, 3, extra_pad=1, seed=1)


def test_padding_is_exactly_zero_and_finite():
    cache = KVCache(2, 1, 8, 2, dtype=np.float64)
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([3, 0]))
    with np.errstate(invalid="raise", divide="raise"):
        out = gqa_attention(np.ones((2, 2, 3, 2)), cache, np.array([1, 0]))
    assert np.all(out[0, :, 1:] == 0) and np.all(out[1] == 0)


def test_overflow_leaves_everything_untouched():
    cache = KVCache(2, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([1, 3]))
    k0, lens0 = cache.k.copy(), cache.lens.copy()
    with pytest.raises(ValueError, match="row 1"):
        cache.append(2 * np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)), np.array([2, 2]))
    assert np.array_equal(cache.k, k0) and np.array_equal(cache.lens, lens0)


def test_buffers_are_not_replaced():
    cache = KVCache(1, 1, 4, 2)
    k_id, v_id = id(cache.k), id(cache.v)
    cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    assert id(cache.k) == k_id and id(cache.v) == v_id
