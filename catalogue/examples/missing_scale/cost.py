"""How much memory and copying the KV cache costs."""

BOTH_K_AND_V = 2
READ_AND_WRITE = 2


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    return BOTH_K_AND_V * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    return bytes_per_token * tokens * (tokens - 1) // 2


def cache_bytes(tokens, bytes_per_token):
    return tokens * bytes_per_token


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    return READ_AND_WRITE * bytes_copied / bandwidth_bytes_per_s


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
