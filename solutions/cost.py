"""The cost model: why the cache is allocated once and written in place.

Integer bytes unless noted. The worked figures (the README's cost table) use Llama 3.1 8B
(32 layers, 8 KV heads, head_dim 128: Meta's released config.json) in bf16
(2 bytes per element) and the H100 SXM's 3.35 TB/s HBM3 bandwidth (NVIDIA H100
datasheet).
"""
from __future__ import annotations


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Bytes of K and V one token adds across all layers: ``2 * layers * kv_heads * head_dim * bytes``.

    Llama 3.1 8B in bf16: ``2 * 32 * 8 * 128 * 2 = 131,072`` B.
    """
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens: int, bytes_per_token: int) -> int:
    """Bytes copied growing a cache by concatenation, one token per step, for ``tokens`` steps.

    Step ``i`` (from 0) copies the ``i`` tokens already there into a new buffer,
    so the total is ``(0 + 1 + ... + (tokens - 1)) * bytes_per_token``:
    4,096 steps copy 8,386,560 tokens, 1.10e12 B at 131,072 B per token.
    """
    return tokens * (tokens - 1) // 2 * bytes_per_token


def cache_bytes(tokens: int, bytes_per_token: int) -> int:
    """Bytes a cache of ``tokens`` tokens holds (4,096 tokens at 131,072 B: 512 MiB)."""
    return tokens * bytes_per_token


def copy_seconds(bytes_copied: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds (float) to copy ``bytes_copied`` bytes: each byte is read once and written once.

    ``2 * 1.10e12 B / 3.35e12 B/s = 0.66 s`` per sequence on an H100 SXM.
    """
    return 2 * bytes_copied / bandwidth_bytes_per_s


def reservation_bytes(rows: int, max_len: int, bytes_per_token: int) -> int:
    """Bytes reserved up front for ``rows`` rows of ``max_len`` tokens (32 x 8,192 at 131,072 B: 32 GiB)."""
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes: int, group_size: int) -> int:
    """Bytes a materialised KV repeat writes per step: every KV head copied ``group_size`` times.

    A 4,096-token row (512 MiB of KV) at G = 4 becomes 2 GiB written, then read, per decode step.
    """
    return cache_bytes * group_size
