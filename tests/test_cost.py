"""The cost model reproduces every figure of the README's cost table exactly."""
from solutions import cost
from grader.shipped.cost_table import cost_rows

PER_TOKEN = cost.kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)


def test_bytes_per_token_of_llama_3_1_8b():
    assert PER_TOKEN == 131_072


def test_concatenation_copies_a_quadratic_number_of_tokens():
    assert cost.concat_bytes_copied(4096, 1) == 8_386_560
    copied = cost.concat_bytes_copied(4096, PER_TOKEN)
    assert copied == 8_386_560 * 131_072
    assert f"{copied:.2e}" == "1.10e+12"
    assert cost.concat_bytes_copied(1, PER_TOKEN) == 0 and cost.concat_bytes_copied(2, 5) == 5


def test_final_cache_reservation_and_repeat():
    final = cost.cache_bytes(4096, PER_TOKEN)
    assert final == 512 * 2**20
    assert cost.reservation_bytes(32, 8192, PER_TOKEN) == 32 * 2**30
    assert cost.repeat_bytes(final, 4) == 2 * 2**30


def test_copy_time_on_an_h100_counts_read_and_write():
    seconds = cost.copy_seconds(cost.concat_bytes_copied(4096, PER_TOKEN), 3.35e12)
    assert round(seconds, 2) == 0.66
    assert cost.copy_seconds(100, 50.0) == 4.0


def test_the_printed_table_comes_from_the_model():
    rows = dict(cost_rows())
    assert rows["KV bytes per token, all layers"] == "131,072 B"
    assert "8,386,560" in rows["tokens copied by concatenation over 4,096 decode steps"]
    assert rows["bytes copied"].startswith("1.10e12 B")
    assert rows["final cache"] == "512 MiB"
    assert rows["time at 3.35 TB/s (H100 SXM), read + write"] == "0.66 s per sequence"
    assert rows["reservation, 32 rows x 8,192 tokens"] == "32 GiB"
    assert "2 GiB" in rows["materialized KV repeat, G = 4, 4,096-token row"]
