"""Back-of-envelope cost model for the KV cache (bytes are exact integers)."""


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    """K and V, every layer: 2 * layers * kv_heads * head_dim * bytes."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    """Growing by concatenation: step i copies the i tokens already there.

    0 + 1 + ... + (tokens - 1) = tokens * (tokens - 1) / 2 tokens in all.
    """
    return bytes_per_token * (tokens * (tokens - 1) // 2)


def cache_bytes(tokens, bytes_per_token):
    return tokens * bytes_per_token


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    """A copy reads and writes every byte, so it moves 2 * bytes_copied."""
    return 2 * bytes_copied / bandwidth_bytes_per_s


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    """Materialising K/V for every query head writes G times the cache."""
    return cache_bytes * group_size
