"""Step 1: a cache allocated once, written in place at each row's length.

Fills ``KVCache.__init__`` and ``KVCache.append`` in kv_cache.py.
"""
import numpy as np

import adapters
import stepkit as kit
from stepkit import case, fail, fmt

STEP = 1


def backend():
    return kit.numpy_backend(adapters.kv_cache(STEP))


def test_allocates_buffers_of_the_right_shape():
    be = backend()
    for args, dtype in (((2, 3, 8, 4), None), ((1, 1, 5, 2), np.float64), ((0, 2, 4, 3), None)):
        B, Hkv, max_len, d = args
        call = f"KVCache({', '.join(map(str, args))}{'' if dtype is None else ', dtype=np.float64'})"
        with case(call):
            cache = be.mod.KVCache(*args) if dtype is None else be.mod.KVCache(*args, dtype=dtype)
        want_dtype = np.float32 if dtype is None else dtype
        for name in ("k", "v"):
            buf = getattr(cache, name, None)
            if not isinstance(buf, np.ndarray):
                fail(f"{call}: cache.{name} is {type(buf).__name__}; it should be a NumPy array "
                     f"of shape [B, Hkv, max_len, d] = {[B, Hkv, max_len, d]}.")
            if buf.shape != (B, Hkv, max_len, d):
                grows = len(buf.shape) == 4 and buf.shape[2] < max_len
                fail(f"{call}: cache.{name} has shape {list(buf.shape)} but should be "
                     f"[B, Hkv, max_len, d] = {[B, Hkv, max_len, d]}, the whole reservation, allocated now"
                     + (": a cache that starts small has to grow, and growing copies it (concat_growth)."
                        if grows else "."))
            if buf.dtype != want_dtype:
                fail(f"{call}: cache.{name} has dtype {buf.dtype} but should have dtype "
                     f"{np.dtype(want_dtype).name}{' (the default)' if dtype is None else ''}.")
        if cache.k.size and np.shares_memory(cache.k, cache.v):
            fail(f"{call}: cache.k and cache.v share memory; they are two separate buffers.")
        lens = getattr(cache, "lens", None)
        if not isinstance(lens, np.ndarray) or lens.dtype != np.int64 or lens.shape != (B,):
            got = type(lens).__name__
            if hasattr(lens, "dtype"):
                got += f" of dtype {lens.dtype} and shape {list(np.shape(lens))}"
            fail(f"{call}: cache.lens is {got}; it should be an int64 NumPy array of shape [B]=({B},).")
        if np.any(lens != 0):
            fail(f"{call}: cache.lens is {fmt(lens)} but a new cache holds no tokens: it should be all zeros.")


def test_append_to_one_row_writes_at_its_length():
    kit.run_appends(backend(), "one row, three appends", B=1, Hkv=1, d=2, max_len=8,
                    calls=[([3], 3), ([1], 1), ([2], 2)])


def test_append_to_several_rows_with_padding():
    kit.run_appends(backend(), "two rows, padded slots", B=2, Hkv=2, d=3, max_len=8,
                    calls=[([3, 1], 3), ([1, 2], 2), ([0, 3], 4), ([0, 0], 2)])


def test_append_never_copies_the_cache():
    be = backend()
    B, Hkv, max_len, d = 2, 2, 512, 64
    setup = f"decode appends into a large reservation (B={B}, Hkv={Hkv}, max_len={max_len}, d={d}, float32)"
    import tracemalloc
    with case(setup):
        cache = be.cache(B, Hkv, max_len, d, np.float32)
        one = np.ones((B, Hkv, 1, d), np.float32)
        cache.append(np.ones((B, Hkv, 100, d), np.float32), np.ones((B, Hkv, 100, d), np.float32),
                     np.array([100, 60]))
        k0, v0 = cache.k, cache.v
        cache.append(one, one, np.array([1, 1]))  # warm up
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            cache.append(one, one, np.array([1, 1]))
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if not was_tracing:
                tracemalloc.stop()
    if cache.k is not k0 or cache.v is not v0:
        fail(f"{setup}: append replaced cache.k or cache.v with a new array: the buffers are allocated once "
             f"and written in place (concat_growth).")
    buffer_bytes = cache.k.nbytes
    new_bytes = 2 * one.nbytes
    if peak >= buffer_bytes // 4:
        fail(f"{setup}: one append of a single token per row allocated {peak / 1024:,.0f} KiB at its peak, "
             f"while the new K and V are {new_bytes:,} B and the whole K buffer is {buffer_bytes / 1024:,.0f} KiB: "
             f"append copies the cache (or a large part of it) instead of writing only the new tokens into "
             f"it (concat_growth).")


def test_overflow_raises_and_changes_nothing():
    kit.run_overflow(backend(), "overflow")


def test_bad_input_is_refused_with_a_clear_error():
    kit.run_bad_appends(backend(), "bad input to append")
