"""The cost model (step 5): why the cache is allocated once and written in place.

Every function returns whole bytes as an int, except ``copy_seconds`` (a float).
Step 5 checks them against a worked example: Llama 3.1 8B (32 layers, 8 KV
heads, head_dim 128) in bf16 (2 bytes per element), 4,096 decode steps, an
H100 SXM's memory bandwidth of 3.35e12 bytes per second, a reservation of 32
rows x 8,192 tokens, and group size G = 4.
"""
from __future__ import annotations


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Bytes one token adds to the cache across all layers (it stores both a key and a value)."""
    raise NotImplementedError("step 5: kv_bytes_per_token")


def concat_bytes_copied(tokens: int, bytes_per_token: int) -> int:
    """Bytes copied when a cache grows by concatenation, one token per step, for ``tokens`` steps.

    Each step builds a new buffer and copies every token already cached into it.
    """
    raise NotImplementedError("step 5: concat_bytes_copied")


def cache_bytes(tokens: int, bytes_per_token: int) -> int:
    """Bytes a cache holding ``tokens`` tokens takes."""
    raise NotImplementedError("step 5: cache_bytes")


def copy_seconds(bytes_copied: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds to copy ``bytes_copied`` bytes at ``bandwidth_bytes_per_s``; a copy reads and writes every byte."""
    raise NotImplementedError("step 5: copy_seconds")


def reservation_bytes(rows: int, max_len: int, bytes_per_token: int) -> int:
    """Bytes reserved up front for ``rows`` rows of ``max_len`` tokens each."""
    raise NotImplementedError("step 5: reservation_bytes")


def repeat_bytes(cache_bytes: int, group_size: int) -> int:
    """Bytes written per step when K/V (``cache_bytes`` of them) are copied out to every query head."""
    raise NotImplementedError("step 5: repeat_bytes")
