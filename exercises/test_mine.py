"""Step 7: your own tests of kv_cache.py, against a direct reference on chunked inputs.

Write a reference that is obviously right rather than fast: keep each row's
tokens in a plain list as you append them, copy the KV heads out to every
query head if you like, and for each real query run a plain softmax over the
keys 0 .. its absolute position. Then feed the same random tokens to your
KVCache in chunks (a prefill, then a chunk with 1 < T < lens, then decode
steps; rows of different lengths; padding) and compare every call's output.

Step 7 runs this file against your own kv_cache.py, where it must pass, and
against planted mistakes (the catalogue's mutants, wrapped around your own
code), and shows which it catches. It must catch chunk_local_mask: a mask
built from the chunk alone, right at T = 1 and T = S and wrong for 1 < T < S.

Import the code under test only as below: step 7 swaps the mutants in
through the module name ``kv_cache``.
"""
import numpy as np

from kv_cache import KVCache, gqa_attention


def reference(q, keys, values, n_new):
    """The expected output for one call, computed the obvious way.

    Args:
        q: [B, Hq, T, d] queries of the call.
        keys, values: keys[b] and values[b] are row b's tokens so far (after the
            append), each an array [Hkv, d], in the order they were appended.
        n_new: the call's per-row counts.

    Returns:
        float64 [B, Hq, T, d]; padded slots 0.
    """
    raise NotImplementedError("step 7: write reference() in test_mine.py")


def test_chunked_prefill_matches_reference():
    raise NotImplementedError("step 7: write your tests in test_mine.py")
