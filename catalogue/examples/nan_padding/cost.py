def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    n = max(tokens, 0)
    return n * (n - 1) // 2 * bytes_per_token


def cache_bytes(tokens, bytes_per_token):
    return tokens * bytes_per_token


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    return 2 * bytes_copied / float(bandwidth_bytes_per_s)


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
