"""Step 5: quantify the cost (cost.py).

The worked example: Llama 3.1 8B (32 layers, 8 KV heads, head_dim 128) in
bf16 (2 bytes per element), 4,096 decode steps, an H100 SXM at 3.35e12 B/s,
32 rows x 8,192 tokens reserved, G = 4. MiB = 2**20 bytes, GiB = 2**30.
"""
import numbers

import adapters
from stepkit import case, fail

STEP = 5
MiB, GiB = 2**20, 2**30


def cost():
    return adapters.cost(STEP)


def check_int(call: str, got, want: int, explain: str):
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        fail(f"{call} returned {got!r} ({type(got).__name__}); bytes are whole numbers: return an int "
             f"({want:,} here).")
    if got != want:
        fail(f"{call} returned {int(got):,} but should return {want:,}: {explain}")


def test_kv_bytes_per_token():
    c = cost()
    with case("kv_bytes_per_token(32, 8, 128, 2)"):
        got = c.kv_bytes_per_token(32, 8, 128, 2)
    if got == 65536:
        fail("kv_bytes_per_token(32, 8, 128, 2) returned 65,536, half of 131,072: each token stores a key "
             "AND a value in every layer.")
    check_int("kv_bytes_per_token(32, 8, 128, 2) (Llama 3.1 8B, bf16)", got, 131072,
              "K and V, in each of 32 layers, 8 KV heads of 128 elements of 2 bytes each.")
    with case("kv_bytes_per_token(1, 1, 4, 4)"):
        check_int("kv_bytes_per_token(1, 1, 4, 4)", c.kv_bytes_per_token(1, 1, 4, 4), 32,
                  "one layer, one KV head, 4 float32 elements, for K and for V.")


def test_concat_bytes_copied():
    c = cost()
    for tokens, per, want, why in (
        (1, 10, 0, "the first step has nothing cached yet, so it copies nothing."),
        (3, 1, 3, "steps 0, 1, 2 copy 0 + 1 + 2 = 3 tokens already cached."),
        (4096, 1, 8_386_560, "0 + 1 + ... + 4,095 = 8,386,560 token copies over 4,096 steps."),
        (4096, 131072, 8_386_560 * 131072,
         "8,386,560 token copies x 131,072 B = 1.10e12 B, about 1.0 TiB, for one 4,096-token sequence."),
    ):
        call = f"concat_bytes_copied({tokens}, {per})"
        with case(call):
            got = c.concat_bytes_copied(tokens, per)
        check_int(call, got, want, why)


def test_cache_bytes():
    c = cost()
    with case("cache_bytes(4096, 131072)"):
        got = c.cache_bytes(4096, 131072)
    check_int("cache_bytes(4096, 131072)", got, 512 * MiB, "4,096 tokens x 131,072 B = 512 MiB.")


def test_copy_seconds():
    c = cost()
    copied = 8_386_560 * 131072
    call = f"copy_seconds({copied:.4g}, 3.35e12)"
    with case(call):
        got = c.copy_seconds(copied, 3.35e12)
    if not isinstance(got, numbers.Real):
        fail(f"{call} returned {got!r}; it should return seconds as a float.")
    want = 2 * copied / 3.35e12
    if abs(got - want / 2) < 1e-3:
        fail(f"{call} returned {got:.3f} s, half of {want:.2f} s: a copy reads each byte once and writes it once.")
    if abs(got - want) > 1e-6 * want:
        fail(f"{call} returned {got!r} but should return 2 x 1.10e12 B / 3.35e12 B/s = {want:.2f} s "
             f"(read + write) per sequence.")


def test_reservation_bytes():
    c = cost()
    with case("reservation_bytes(32, 8192, 131072)"):
        got = c.reservation_bytes(32, 8192, 131072)
    check_int("reservation_bytes(32, 8192, 131072)", got, 32 * GiB, "32 rows x 8,192 tokens x 131,072 B = 32 GiB.")


def test_repeat_bytes():
    c = cost()
    with case("repeat_bytes(512 MiB, 4)"):
        got = c.repeat_bytes(512 * MiB, 4)
    check_int(f"repeat_bytes({512 * MiB}, 4)", got, 2 * GiB,
              "repeating 512 MiB of K/V to G = 4 query heads each writes 2 GiB, then reads it, every decode step.")
