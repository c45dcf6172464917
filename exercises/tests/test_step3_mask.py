"""Step 3: the causal mask, aligned to the end of the cache (bottom-right).

Query t of a call that appended n_new tokens to a row now holding lens tokens
sits at absolute position lens - n_new + t and sees keys 0 .. that position.
Checked for decode (T = 1), full prefill (T = S) and chunked prefill (T < S).

Every query here is all zeros, so each key it sees gets the same weight, and
every value codes its key's position: the output tells exactly which keys a
query saw.
"""
import adapters
import stepkit as kit

STEP = 3


def backend():
    return kit.numpy_backend(adapters.kv_cache(STEP))


def test_decode_sees_every_key_up_to_its_own():
    # 5 tokens of prefill (not checked here), then three decode steps (T = 1).
    kit.run_windows(backend(), "decode", Hkv=1, G=2, calls=[([5], 5), ([1], 1), ([1], 1), ([1], 1)],
                    check={1, 2, 3})


def test_full_prefill_is_causal():
    kit.run_windows(backend(), "full prefill", Hkv=1, G=2, calls=[([6], 6)])


def test_chunked_prefill_sees_the_cache_before_the_chunk():
    # 4 tokens, then a chunk of 3: T=3 < S=7.
    kit.run_windows(backend(), "chunked prefill", Hkv=1, G=2, calls=[([4], 4), ([3], 3)], check={1})


def test_prefill_chunks_then_decode_with_gqa():
    kit.run_windows(backend(), "prefill, chunks, then decode", Hkv=2, G=3,
                    calls=[([3], 3), ([2], 2), ([4], 4), ([1], 1), ([1], 1)])


def test_two_rows_of_equal_length():
    kit.run_windows(backend(), "two rows, chunked", Hkv=2, G=2,
                    calls=[([2, 2], 2), ([3, 3], 3), ([1, 1], 1)])
