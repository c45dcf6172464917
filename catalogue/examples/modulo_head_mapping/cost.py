def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    k_and_v = 2
    return k_and_v * layers * kv_heads * head_dim * bytes_per_element


def concat_bytes_copied(tokens, bytes_per_token):
    # growing by one token at a time: step i copies the i tokens already stored
    copied_tokens = tokens * (tokens - 1) // 2 if tokens > 0 else 0
    return copied_tokens * bytes_per_token


def cache_bytes(tokens, bytes_per_token):
    return tokens * bytes_per_token


def copy_seconds(bytes_copied, bandwidth_bytes_per_s):
    bytes_moved = 2 * bytes_copied     # each byte is read once and written once
    return bytes_moved / bandwidth_bytes_per_s


def reservation_bytes(rows, max_len, bytes_per_token):
    return rows * max_len * bytes_per_token


def repeat_bytes(cache_bytes, group_size):
    return cache_bytes * group_size
