"""KV cache cost model (bytes)."""


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    return bytes_per_token * tokens * (tokens - 1) // 2


def cache_bytes(tokens, bytes_per_token):
    return bytes_per_token * tokens


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    return (bytes_copied + bytes_copied) / bandwidth_bytes_per_s   # read + write


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
