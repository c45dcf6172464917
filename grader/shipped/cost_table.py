"""The cost table of the README's cost table, computed from the cost model (never typed in).

Figures: Llama 3.1 8B (32 layers, 8 KV heads, head_dim 128; Meta's config.json),
bf16, 4,096 decode steps, H100 SXM at 3.35e12 B/s (NVIDIA datasheet),
32 rows x 8,192 tokens of reservation, group size 4.
"""
from __future__ import annotations

from solutions import cost

LLAMA_8B = dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)
STEPS = 4096
H100_BYTES_PER_S = 3.35e12
ROWS, MAX_LEN, GROUP = 32, 8192, 4
MiB, GiB, TiB = 2**20, 2**30, 2**40


def cost_rows() -> list[tuple[str, str]]:
    """``(quantity, value)`` rows of the table, each computed with ``solutions.cost``."""
    per_token = cost.kv_bytes_per_token(**LLAMA_8B)
    copied = cost.concat_bytes_copied(STEPS, per_token)
    final = cost.cache_bytes(STEPS, per_token)
    return [
        ("KV bytes per token, all layers", f"{per_token:,} B"),
        (f"tokens copied by concatenation over {STEPS:,} decode steps", f"{copied // per_token:,}"),
        ("bytes copied", f"{copied:.2e} B (about {copied / TiB:.1f} TiB)".replace("e+", "e")),
        ("final cache", f"{final / MiB:,.0f} MiB"),
        ("time at 3.35 TB/s (H100 SXM), read + write",
         f"{cost.copy_seconds(copied, H100_BYTES_PER_S):.2f} s per sequence"),
        ("preallocated write per new token", f"{per_token:,} B, whatever the length"),
        (f"reservation, {ROWS} rows x {MAX_LEN:,} tokens",
         f"{cost.reservation_bytes(ROWS, MAX_LEN, per_token) / GiB:.0f} GiB"),
        (f"materialized KV repeat, G = {GROUP}, {STEPS:,}-token row",
         f"{final / MiB:.0f} MiB of KV becomes {cost.repeat_bytes(final, GROUP) / GiB:.0f} GiB per decode step"),
    ]


def print_cost_table() -> None:
    """Print the table to the terminal with rich."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Why the KV cache is allocated once (Llama 3.1 8B, bf16)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for quantity, value in cost_rows():
        table.add_row(quantity, value)
    Console().print(table)


# Odd inputs beside the table's, so a cost.py cannot pass by typing the table's figures in.
ODD_INPUTS = {"kv_bytes_per_token": [3, 5, 7, 4], "concat_bytes_copied": [10, 7], "copy_seconds": [300, 100.0],
              "reservation_bytes": [3, 10, 7], "repeat_bytes": [100, 3]}


def cost_calls() -> list[list]:
    """``[label, function name, args]`` for every call the grader makes into a submission's ``cost.py``:
    the table's own inputs (the constants above), then ``ODD_INPUTS``."""
    per_token = cost.kv_bytes_per_token(**LLAMA_8B)
    final = cost.cache_bytes(STEPS, per_token)
    table = [
        ("kv_bytes_per_token", [LLAMA_8B[k] for k in ("layers", "kv_heads", "head_dim", "bytes_per_element")]),
        ("concat_bytes_copied", [STEPS, per_token]),
        ("cache_bytes", [STEPS, per_token]),
        ("copy_seconds", [cost.concat_bytes_copied(STEPS, per_token), H100_BYTES_PER_S]),
        ("reservation_bytes", [ROWS, MAX_LEN, per_token]),
        ("repeat_bytes", [final, GROUP]),
    ]
    calls = []
    for name, args in table:
        for use in ([args, ODD_INPUTS[name]] if name in ODD_INPUTS else [args]):
            calls.append([f"{name}({', '.join(repr(a) for a in use)})", name, list(use)])
    return calls
