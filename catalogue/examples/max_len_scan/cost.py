"""KV-cache cost model (integer bytes; copy_seconds is a float)."""


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    """Bytes of K plus V for one token across all layers."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    """Growing the cache by concatenation for `tokens` steps: step i copies i tokens."""
    return bytes_per_token * tokens * (tokens - 1) // 2


def cache_bytes(tokens, bytes_per_token):
    return bytes_per_token * tokens


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    """A copy reads and writes each byte: 2 * bytes over the bandwidth."""
    return 2 * bytes_copied / bandwidth_bytes_per_s


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
