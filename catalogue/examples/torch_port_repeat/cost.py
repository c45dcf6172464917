"""Cost model for KV caching (section 2 table)."""


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    per_layer = kv_heads * head_dim * bytes_per_element
    return 2 * layers * per_layer          # K and V


def concat_bytes_copied(tokens, bytes_per_token):
    # concatenating one token at a time: the i-th step copies i existing tokens
    copied = 0
    for i in range(tokens):
        copied += i
    return copied * bytes_per_token


def cache_bytes(tokens, bytes_per_token):
    return tokens * bytes_per_token


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    return 2 * bytes_copied / bandwidth_bytes_per_s   # read + write


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
