# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Grouped-query attention over a KV cache allocated once
#
# At inference time a decoder keeps the keys and values of every token it has seen, the
# **KV cache**, and each new token attends over all of them. In this notebook you build that
# step: grouped-query attention (GQA) over a cache that is **allocated once and written in
# place**, for prefill chunks and for single-token decode. First in NumPy, then in PyTorch:
#
# * `KVCache`: the K and V buffers `[B, Hkv, max_len, d]`, allocated once, and `lens[b]`,
#   the number of valid tokens in row `b`;
# * `gqa_attention(q, cache, n_new)`: the attention of the tokens just appended against
#   everything the cache holds.
#
# The three rules your code must follow:
#
# 1. KV is written once, at the row's current length, and never moved or copied afterwards.
# 2. Query head `h` reads KV head `h // G`, where `G = Hq / Hkv` is the group size.
# 3. Query `t` of a chunk of `n_new[b]` tokens sits at absolute position
#    `lens[b] - n_new[b] + t` (`lens` taken after the append) and sees keys `0 ..` that position.
#
# Names used throughout: `B` rows, `Hkv` KV heads, `Hq = G * Hkv` query heads, `d` the head
# dimension, `T` query slots per call, `S = lens.max()` live keys. MQA is `Hkv = 1`, MHA is `G = 1`.
#
# **How this notebook is graded.** Fill in every cell that says `# YOUR CODE HERE` (delete the
# `raise NotImplementedError()`), and keep the names and argument orders. Each cell worth points
# checks one requirement: the asserts you can read there are small cases meant to help you, and the
# grader adds its own hidden checks (random and targeted cases against a direct reference, the same
# as the kit's `kvkit grade`). Before you submit, restart the kernel and run every cell.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points", "locked": true, "schema_version": 3, "solution": false, "task": false}
# | requirement | graded cell | rubric criteria |
# | --- | --- | --- |
# | the cache is allocated once and written in place at each row's length | `test_in_place` | `preallocated_in_place` |
# | an append past `max_len` raises `ValueError` and changes nothing | `test_overflow` | `overflow_atomic` |
# | query head `h` reads KV head `h // G` | `test_head_mapping` | `head_mapping` |
# | no copy of K/V per query head | `test_no_kv_repeat` | `no_kv_repeat` |
# | decode (T = 1) | `test_decode` | `decode` |
# | full prefill (T = S) | `test_full_prefill` | `full_prefill` |
# | chunked prefill (1 < T < S): the offset mask | `test_chunked_prefill` | `chunked_prefill` |
# | ragged rows: keys past a shorter row's length are masked | `test_ragged_rows` | `ragged_rows` |
# | padded slots and zero-token rows are exactly 0, never NaN | `test_padding` | `padding` |
# | the cost model reproduces the cost table | `test_cost` | `cost_model` |
# | the PyTorch port: right outputs, in-place writes, no hidden repeat | `test_torch_port` | `torch_port` |
# | your own check against a direct reference catches the chunk-local mask | `test_own_check` | `own_tests` |
#
# Each graded cell is worth the points of the rubric criteria it names: the kit's rubric
# (`grader/rubric.toml`), the one `kvkit grade` uses, so the notebook and the grader weigh a requirement
# alike; your feedback shows each cell's score out of its points. One criterion of the rubric is not
# graded here: `live_length` (attention over the live keys, not `max_len`), which `kvkit grade` measures
# by timing. The PyTorch port (section 7) is optional: left as handed out, it counts neither for nor
# against you, its cell then worth your share of its points (the fraction you earned on the other cells).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"role": "setup"}
import math

import numpy as np

# %% nbgrader={"grade": false, "grade_id": "setup_notebook", "locked": true, "schema_version": 3, "solution": false, "task": false}
import matplotlib.pyplot as plt

rng = np.random.default_rng(0)


# %% [markdown] nbgrader={"grade": false, "grade_id": "cache_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 1}
# ## 1. The cache
#
# The contract (keep these names and argument orders):
#
# * `KVCache(batch, kv_heads, max_len, head_dim, dtype=np.float32)` allocates `k` and `v`, zero-filled,
#   of shape `[B, Hkv, max_len, d]`, and `lens`, int64 `[B]`, all zeros.
# * `append(k_new, v_new, n_new)`: `k_new` and `v_new` are `[B, Hkv, T, d]`; `n_new` is int `[B]`, and
#   the first `n_new[b]` of row `b`'s `T` slots are real tokens (`0 <= n_new[b] <= T`), the rest
#   padding, not stored. Row `b`'s tokens go to positions `lens[b] .. lens[b] + n_new[b] - 1`, then
#   `lens[b]` grows by `n_new[b]`.
# * Never replace `self.k` or `self.v` (no `np.concatenate`, no new array): assign into slices of them.
# * An append that would take any row past `max_len` raises `ValueError` and changes nothing: not
#   `lens`, not any row. Check every row before you write any.
# * Shapes that do not match the cache raise `ValueError`, with a message naming the argument and the
#   shapes. The helper `check_counts` below validates `n_new`; use it.

# %% nbgrader={"grade": false, "grade_id": "check_counts", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"role": "implementation"}
def check_counts(n_new, batch: int, limit: int, name: str = "n_new") -> np.ndarray:
    """`n_new` as int64 `[batch]`, each in 0..limit; ValueError (TypeError for non-integers) otherwise."""
    counts = np.asarray(n_new)
    if counts.shape != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {counts.shape}")
    if batch and not np.issubdtype(counts.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64)
    bad = np.flatnonzero((counts < 0) | (counts > limit))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(counts[b])} is outside 0..T={limit}")
    return counts


# %% nbgrader={"grade": false, "grade_id": "kv_cache", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "implementation"}
class KVCache:
    """K/V buffers `[B, Hkv, max_len, d]`, allocated once and written in place.

    Attributes:
        k, v: `[batch, kv_heads, max_len, head_dim]` arrays of `dtype`, never replaced.
        lens: int64 `[batch]`, the number of valid tokens in each row.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=np.float32):
        ### BEGIN SOLUTION
        for name, value, low in (("batch", batch, 0), ("kv_heads", kv_heads, 1),
                                 ("max_len", max_len, 0), ("head_dim", head_dim, 1)):
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        shape = (int(batch), int(kv_heads), int(max_len), int(head_dim))
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(int(batch), dtype=np.int64)
        ### END SOLUTION

    def append(self, k_new: np.ndarray, v_new: np.ndarray, n_new) -> None:
        """Write the first `n_new[b]` tokens of each row `b` at position `lens[b]`, in place.

        Raises:
            ValueError: shapes that do not match the cache, `n_new` out of range, or a row that
                would pass `max_len`; then nothing changes.
        """
        ### BEGIN SOLUTION
        B, Hkv, max_len, d = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = check_counts(n_new, B, k_new.shape[2])
        end = self.lens + n_new
        over = np.flatnonzero(end > max_len)
        if over.size:
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        # Every row fits, so no write below can fail half-way through the batch.
        for b in range(B):
            start, stop = int(self.lens[b]), int(end[b])
            self.k[b, :, start:stop] = k_new[b, :, :stop - start]
            self.v[b, :, start:stop] = v_new[b, :, :stop - start]
        # Last, so that no row ever claims a token it has not stored.
        self.lens[:] = end
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_in_place", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["preallocated_in_place"]}
cache = KVCache(2, 1, 6, 2, dtype=np.float64)
k_buffer, v_buffer = cache.k, cache.v
assert cache.k.shape == cache.v.shape == (2, 1, 6, 2) and cache.k.dtype == np.float64
assert cache.lens.dtype == np.int64 and cache.lens.tolist() == [0, 0]

tokens = np.arange(1.0, 13.0).reshape(2, 1, 3, 2)
cache.append(tokens, -tokens, np.array([3, 1]))  # row 0: 3 tokens; row 1: 1 token, 2 padded slots
assert cache.lens.tolist() == [3, 1]
assert cache.k is k_buffer and cache.v is v_buffer, "append must write into the buffers, not replace them"
assert np.array_equal(cache.k[0, :, :3], tokens[0]) and np.array_equal(cache.v[0, :, :3], -tokens[0])
assert np.array_equal(cache.k[1, :, :1], tokens[1, :, :1])
assert not cache.k[1, :, 1:].any(), "padded slots must not be stored"

# A decode step: one token per row lands right after what each row holds. (One token, not a chunk after
# cached tokens: a cache may refuse chunked prefill, which only test_chunked_prefill charges.)
cache.append(tokens[:, :, :1], -tokens[:, :, :1], np.array([1, 1]))
assert cache.lens.tolist() == [4, 2]
assert np.array_equal(cache.k[0, :, 3], tokens[0, :, 0])
assert np.array_equal(cache.k[1, :, 1], tokens[1, :, 0]) and np.array_equal(cache.v[1, :, 1], -tokens[1, :, 0])
assert cache.k is k_buffer and cache.v is v_buffer
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

result = check("preallocated_in_place", KVCache, None)
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_overflow", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["overflow_atomic"]}
cache = KVCache(2, 1, 4, 2, dtype=np.float64)
cache.append(np.ones((2, 1, 3, 2)), np.ones((2, 1, 3, 2)), np.array([3, 0]))
k_before, v_before, lens_before = cache.k.copy(), cache.v.copy(), cache.lens.copy()
try:
    # Row 0 has room for its one token; row 1, empty, gets 5 tokens, one more than max_len. (No chunk after
    # cached tokens, as in kvkit grade: a cache that refuses chunked prefill is charged for it once, elsewhere.)
    cache.append(np.full((2, 1, 5, 2), 7.0), np.full((2, 1, 5, 2), 7.0), np.array([1, 5]))
except ValueError:
    pass
else:
    raise AssertionError("an append past max_len must raise ValueError")
assert cache.lens.tolist() == lens_before.tolist(), "a failed append must leave lens unchanged"
assert np.array_equal(cache.k, k_before) and np.array_equal(cache.v, v_before), \
    "a failed append must not write any row (check every row first)"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

result = check("overflow_atomic", KVCache, None)
assert result.passed, result.message
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "heads_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 2}
# ## 2. The head mapping
#
# In GQA, `Hq` query heads share `Hkv` KV heads: each KV head serves a group of `G = Hq / Hkv`
# **consecutive** query heads, so query head `h` reads KV head `h // G`. Released GQA checkpoints lay
# their heads out this way (Llama 3.1 8B: 32 query heads, 8 KV heads; heads 0-3 read KV head 0, heads
# 12-15 read KV head 3), and so does PyTorch's `scaled_dot_product_attention(..., enable_gqa=True)`.
# `h % Hkv` interleaves the groups instead. It is wrong, and silent whenever `Hkv = 1` (MQA) or
# `G = 1` (MHA), where the two formulas agree: only a real GQA layout shows it.

# %% nbgrader={"grade": false, "grade_id": "heads_picture", "locked": true, "schema_version": 3, "solution": false, "task": false}
HQ_PIC, HKV_PIC = 8, 2
G_PIC = HQ_PIC // HKV_PIC
h = np.arange(HQ_PIC)
fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.4), sharey=True)
for ax, reads, title in ((axes[0], h // G_PIC, "h // G: right"), (axes[1], h % HKV_PIC, "h % Hkv: wrong")):
    grid = np.zeros((HQ_PIC, HKV_PIC))
    grid[h, reads] = 1
    ax.imshow(grid, cmap="Greens", vmin=0, vmax=1.3, aspect="auto")
    ax.set_title(title)
    ax.set_xticks(range(HKV_PIC))
    ax.set_xlabel("KV head")
    ax.set_yticks(range(HQ_PIC))
axes[0].set_ylabel("query head h")
fig.suptitle(f"Which KV head each query head reads (Hq = {HQ_PIC}, Hkv = {HKV_PIC}, G = {G_PIC})")
plt.tight_layout()
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "heads_how", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Do not copy K and V out to `Hq` heads (`np.repeat(k, G, axis=1)`): at `G = 4` on a 4,096-token
# Llama row that turns 512 MiB of KV into 2 GiB written, then read, at every decode step
# (`repeat_bytes`, section 6). View the queries as `[B, Hkv, G, T, d]` instead: query head
# `h = j * G + g` lands at `[j, g]`, and `j` is the KV head it reads. Then
# `qg @ k[:, :, None].swapaxes(-1, -2)` multiplies `[B, Hkv, G, T, d]` by `[B, Hkv, 1, d, S]`, and
# NumPy's `matmul` broadcasts K over the group axis by strides, without a copy.
#
# Write `group_queries`; it also rejects a head count that is not a multiple of `Hkv`.

# %% nbgrader={"grade": false, "grade_id": "group_queries", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "implementation"}
def group_queries(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """View q `[B, Hq, T, d]` as `[B, Hkv, G, T, d]`: query head h = j * G + g goes to `[j, g]`.

    Raises:
        ValueError: `Hq` is not a positive multiple of `kv_heads`.
    """
    ### BEGIN SOLUTION
    B, Hq, T, d = q.shape
    if Hq == 0 or Hq % kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={kv_heads}")
    return q.reshape(B, kv_heads, Hq // kv_heads, T, d)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "group_queries_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
q_heads = np.arange(32.0).reshape(1, 32, 1, 1)  # Llama 3.1 8B: 32 query heads, 8 KV heads
grouped = group_queries(q_heads, 8)
assert grouped.shape == (1, 8, 4, 1, 1)
assert grouped[0, 3, 1, 0, 0] == 13, "query head 13 belongs to KV head 13 // 4 = 3 (not 13 % 8 = 5)"
assert np.shares_memory(grouped, q_heads), "a view of q, not a copy"
try:
    group_queries(np.zeros((1, 6, 1, 4)), 4)
except ValueError as error:
    print("6 query heads over 4 KV heads:", error)
else:
    raise AssertionError("Hq = 6 over Hkv = 4 must raise ValueError")
print("group_queries: ok")

# %% [markdown] nbgrader={"grade": false, "grade_id": "mask_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 3}
# ## 3. The offset mask
#
# A chunk of `T` new tokens arrives after tokens already cached: in chunked prefill, a long prompt is
# fed a few hundred tokens at a time; in decode, `T = 1`. After the append the row holds `lens[b]`
# tokens, and query `t` of the chunk is token `lens[b] - n_new[b] + t` of the row. It sees every key
# up to and including that position: the cached ones and the chunk's own earlier tokens. For one row
# the `[T, S]` mask is aligned to the **bottom right**: the last query sees every key,
# `np.tril(np.ones((T, S)), k=S - T)`.
#
# The common mistake builds the mask from the chunk alone, aligned to the top left: query `t` sees
# keys `0 .. t`. That is what PyTorch's `is_causal=True` does when `T != S`. It is right for a full
# prefill (`T = S`) and, when decode skips the mask, at `T = 1`: a test of decode and full prefill
# alone never sees it. It is wrong for every chunked prefill step (`1 < T < S`). In PyTorch the
# bottom-right mask is `torch.nn.attention.bias.causal_lower_right`. Here is a chunk of 3 tokens
# after 5 cached ones:

# %% nbgrader={"grade": false, "grade_id": "mask_picture", "locked": true, "schema_version": 3, "solution": false, "task": false}
CACHED, T_PIC = 5, 3
S_PIC = CACHED + T_PIC
bottom_right = np.tril(np.ones((T_PIC, S_PIC), dtype=bool), k=S_PIC - T_PIC)
chunk_local = np.tril(np.ones((T_PIC, S_PIC), dtype=bool))
fig, axes = plt.subplots(1, 2, figsize=(11, 2.9), sharey=True)
panels = ((axes[0], bottom_right, "offset mask (bottom-right): right"),
          (axes[1], chunk_local, "chunk-local mask (top-left): wrong"))
for ax, visible, title in panels:
    ax.imshow(visible, cmap="Greens", vmin=0, vmax=1.3)
    for t in range(T_PIC):
        for s in range(S_PIC):
            ax.text(s, t, "1" if visible[t, s] else "0", ha="center", va="center", fontsize=9,
                    color="white" if visible[t, s] else "gray")
    ax.axvline(CACHED - 0.5, color="black", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_xticks(range(S_PIC))
    ax.set_xlabel(f"key position s (0-{CACHED - 1} cached, {CACHED}-{S_PIC - 1} this chunk)")
axes[0].set_yticks(range(T_PIC), [f"t={t} (pos {CACHED + t})" for t in range(T_PIC)])
axes[0].set_ylabel("query slot")
plt.tight_layout()
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "mask_write", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Write `visible_keys` for a whole batch, as a boolean `[B, T, S]` (True: the key is visible). Two more
# facts it must encode, explained in the next section: rows have their own lengths, and slots
# `t >= n_new[b]` are padding, which see no key at all. A real query of row `b` sits at a position below
# `lens[b]`, so if you mask by position, a shorter row's empty key slots (`lens[b] .. S - 1`) are
# already hidden.

# %% nbgrader={"grade": false, "grade_id": "visible_keys", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "implementation"}
def visible_keys(lens, n_new, T: int, S: int) -> np.ndarray:
    """Which keys each query slot sees: bool `[B, T, S]`.

    lens: int `[B]`, row lengths after the append; n_new: int `[B]`, the real tokens of each row in
    this call; T: query slots; S: live keys. Slot t < n_new[b] of row b sits at absolute position
    lens[b] - n_new[b] + t and sees keys 0 .. that position; slots t >= n_new[b] see nothing.
    """
    ### BEGIN SOLUTION
    lens, n_new = np.asarray(lens), np.asarray(n_new)
    # Positions count from the start of the row, not of the chunk: a chunk after
    # cached tokens sees them all (a top-left mask would hide them), and as every
    # position is below lens[b], a shorter row never sees the empty slots past its end.
    position = (lens - n_new)[:, None] + np.arange(T)
    real = np.arange(T) < n_new[:, None]
    return (np.arange(S) <= position[:, :, None]) & real[:, :, None]
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "visible_keys_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The chunk of the picture: 3 new tokens after 5 cached ones, one row.
assert np.array_equal(visible_keys([8], [3], 3, 8)[0], np.tril(np.ones((3, 8), dtype=bool), k=5)), \
    "query t of the chunk sees keys 0 .. 5 + t"
# Decode: the one new token sees every key, its own included.
assert visible_keys([4], [1], 1, 4).all()
# Full prefill: the usual causal triangle.
assert np.array_equal(visible_keys([3], [3], 3, 3)[0], np.tril(np.ones((3, 3), dtype=bool)))
# Ragged decode: a row of 2 tokens next to a row of 5 sees its own 2 keys only.
assert visible_keys([5, 2], [1, 1], 1, 5)[1, 0].tolist() == [True, True, False, False, False]
# Padding: row 1 has 1 real token in 3 slots; slots 1 and 2 see nothing. A zero-token row sees nothing.
padded = visible_keys([4, 2, 3], [3, 1, 0], 3, 4)
assert padded[1, 0].tolist() == [True, True, False, False] and not padded[1, 1:].any()
assert not padded[2].any()
print("visible_keys: ok")


# %% [markdown] nbgrader={"grade": false, "grade_id": "ragged_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 4}
# ## 4. Ragged rows and padding
#
# The rows of a batch hold different numbers of tokens: a request in decode sits next to one still
# reading its prompt. One call carries `T` slots per row; row `b` uses the first `n_new[b]`, the rest
# are padding, and a row that gets no token in this call (`n_new[b] = 0`) is all padding. Attention
# runs over `S = lens.max()` live keys, never over `max_len`: decode reads every byte of K and V it
# attends over, so scanning the whole reservation would cost `max_len / lens.max()` times the needed
# traffic. For a shorter row the key slots from `lens[b]` to `S - 1` are empty and stay masked.
#
# A padded slot sees no key, and a plain softmax over a row of `-inf` subtracts the row's maximum,
# `-inf`, from itself: `-inf - (-inf)` is NaN, and so is every weight. The contract asks for exactly 0
# there: finite, so a NaN never leaks into a later sum, and the same whatever the padding held. Write
# `softmax_visible` so that a row with nothing visible gets all-zero weights, with no floating-point
# warning: the checks run with NumPy's warnings for invalid values, division by zero and overflow
# turned into errors.

# %% nbgrader={"grade": false, "grade_id": "softmax_visible", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "implementation"}
def softmax_visible(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, over visible entries only; a row with none visible gives zeros.

    scores: float `[..., S]`; visible: bool, broadcastable to scores.
    """
    ### BEGIN SOLUTION
    scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    # Subtracting the peak keeps exp from overflowing; with nothing visible the peak is
    # -inf, and -inf - -inf would be NaN.
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    # Hidden entries weigh exp(-inf) = 0, so a row that sees nothing sums to 0: divide it by 1.
    return weights / np.where(total > 0, total, 1.0)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "softmax_visible_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
with np.errstate(divide="raise", over="raise", invalid="raise"):
    weights = softmax_visible(np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1000.0, 0.0, 1000.0]]),
                              np.array([[True, True, False], [False, False, False], [True, True, True]]))
assert np.allclose(weights[0], [1 / (1 + math.e), math.e / (1 + math.e), 0.0])
assert np.array_equal(weights[1], [0.0, 0.0, 0.0]), "nothing visible: exactly 0, not NaN"
assert np.allclose(weights[2], [0.5, 0.0, 0.5]), "large scores must not overflow"
print("softmax_visible: ok")


# %% [markdown] nbgrader={"grade": false, "grade_id": "attention_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 4}
# ## 5. Attention over the cache
#
# Now put it together. `gqa_attention(q, cache, n_new)`: `q` is `[B, Hq, T, d]`, the queries of the
# `T` slots just appended (with the same `n_new` as the `append`); it returns `[B, Hq, T, d]` in q's
# dtype: `softmax(q k^T / sqrt(d)) v` over the visible keys, padded slots exactly 0.
#
# 1. Check the input: `q` has the cache's `B` and `d`, `Hq` is a multiple of `Hkv` (`group_queries`),
#    `n_new` is valid (`check_counts`), and no row got more new tokens than it holds.
# 2. If `T = 0` or `S = lens.max() = 0` (B = 0, an empty cache), return zeros of q's shape.
# 3. Take the live K and V as views, `cache.k[:, :, :S]` (no copy, and never `max_len` keys).
# 4. Scores `[B, Hkv, G, T, S]`, the mask `visible_keys`, the weights `softmax_visible`, then
#    weights times V, and back to `[B, Hq, T, d]`.

# %% nbgrader={"grade": false, "grade_id": "gqa_attention", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "implementation"}
def gqa_attention(q: np.ndarray, cache: KVCache, n_new) -> np.ndarray:
    """Causal GQA of the tokens just appended against everything in `cache`.

    Raises:
        ValueError: `Hq` not a multiple of `Hkv`, B or d not the cache's, `n_new` out of range,
            or more new tokens than a row holds.
    """
    ### BEGIN SOLUTION
    q = np.asarray(q)
    B, Hkv, _, d = cache.k.shape
    if q.ndim != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    T = q.shape[2]
    qg = group_queries(q, Hkv)
    n_new = check_counts(n_new, B, T)
    short = np.flatnonzero(n_new > cache.lens)
    if short.size:
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(cache.lens[b])} tokens")

    out = np.zeros(q.shape, dtype=q.dtype)
    # The live length, not max_len: keys past the longest row are empty for every row,
    # and decode reads every byte of K and V it attends over.
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return out
    # Slices of the buffers are views; the new axis lets matmul reuse each KV head
    # for its G query heads by strides instead of copying it G times.
    k = cache.k[:, :, None, :S]
    v = cache.v[:, :, None, :S]
    scores = qg @ k.swapaxes(-1, -2) / math.sqrt(d)
    visible = visible_keys(cache.lens, n_new, T, S)[:, None, None]
    out[...] = (softmax_visible(scores, visible) @ v).reshape(q.shape)
    return out
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "checks_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### The graded checks
#
# Each cell below is one requirement, worth the points of the rubric criteria it names in the table at
# the top. The asserts you can read use small cases and compare your code with itself: a decode step
# must give what a full prefill gives for its last token, a chunk after cached tokens what a full
# prefill gives for its last `T` tokens, a batch what each of its rows gives alone. The grader then
# compares your code with a direct reference on its own hidden random trials (`Hkv` in {1, 2, 4}, `G`
# from 1 to 8, 1 to 3 rows, up to 40 tokens fed in chunks of 1 to 8) and targeted cases (MQA, MHA, the
# head layouts of real checkpoints, zero-token rows, B = 0). A graded cell scores 0 if it raises an
# error or prints a warning; since NaN on padded slots is the business of `test_padding` alone, the
# other cells run with NumPy's floating-point warnings silenced (`quietly`). The helpers used by the
# asserts:

# %% nbgrader={"grade": false, "grade_id": "consistency_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false}
def quietly():
    """NumPy's floating-point warnings silenced. nbgrader fails a graded cell that prints a warning,
    and NaN on padded slots is test_padding's business alone, so the other cells use this."""
    return np.errstate(divide="ignore", over="ignore", invalid="ignore")


def prefill_then_chunk(cached, T, Hkv=2, G=3, d=8, seed=1):
    """The last T outputs of one full prefill, and the outputs of the same T tokens as a chunk after
    `cached` tokens (for T = 1, a decode step). Rule 3 says they are equal."""
    r = np.random.default_rng(seed)
    S = cached + T
    k, v = r.standard_normal((2, 1, Hkv, S, d))
    q = r.standard_normal((1, Hkv * G, S, d))
    whole = KVCache(1, Hkv, S, d, dtype=np.float64)
    whole.append(k, v, np.array([S]))
    full = gqa_attention(q, whole, np.array([S]))
    split = KVCache(1, Hkv, S, d, dtype=np.float64)
    split.append(k[:, :, :cached], v[:, :, :cached], np.array([cached]))
    split.append(k[:, :, cached:], v[:, :, cached:], np.array([T]))
    return full[:, :, cached:], gqa_attention(q[:, :, cached:], split, np.array([T]))


def history(rows, chunks, Hkv=2, G=2, d=4, seed=2):
    """Outputs of a batch fed `chunks` (per call, tokens per row; T = the largest count of the call),
    and the same rows fed alone; a list of `(batch_out, alone_outs, counts)` per call."""
    r = np.random.default_rng(seed)
    max_len = int(np.sum(chunks, axis=0).max())
    batch = KVCache(rows, Hkv, max_len, d, dtype=np.float64)
    alone = [KVCache(1, Hkv, max_len, d, dtype=np.float64) for _ in range(rows)]
    calls = []
    for counts in chunks:
        counts = np.array(counts)
        T = max(int(counts.max()), 1)
        k, v = r.standard_normal((2, rows, Hkv, T, d))
        q = r.standard_normal((rows, Hkv * G, T, d))
        batch.append(k, v, counts)
        out = gqa_attention(q, batch, counts)
        outs = []
        for b in range(rows):
            alone[b].append(k[b:b + 1], v[b:b + 1], counts[b:b + 1])
            outs.append(gqa_attention(q[b:b + 1], alone[b], counts[b:b + 1]))
        calls.append((out, outs, counts))
    return calls


# %% nbgrader={"grade": true, "grade_id": "test_head_mapping", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["head_mapping"]}
# One token per row: its only visible key is itself, so head h returns exactly v of KV head h // G.
cache = KVCache(1, 8, 2, 4, dtype=np.float64)  # Llama 3.1 8B's layout: Hq = 32, Hkv = 8, G = 4
v_one = rng.standard_normal((1, 8, 1, 4))
cache.append(rng.standard_normal((1, 8, 1, 4)), v_one, np.array([1]))
out = gqa_attention(rng.standard_normal((1, 32, 1, 4)), cache, np.array([1]))
assert out.shape == (1, 32, 1, 4)
assert np.allclose(out[0, 13], v_one[0, 13 // 4]), "query head 13 must read KV head 13 // 4 = 3"
for h in range(32):
    assert np.allclose(out[0, h], v_one[0, h // 4]), f"query head {h} must read KV head {h // 4}"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

with quietly():
    result = check("head_mapping", KVCache, gqa_attention)
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_no_kv_repeat", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["no_kv_repeat"]}
# No copy of K or V per query head: a decode step at G = 8 over 2,048 cached tokens allocates far less
# than the 8 copies of K (and of V) a repeat makes. tracemalloc sees NumPy's allocations.
import tracemalloc

cache = KVCache(1, 1, 2049, 64, dtype=np.float64)
cache.append(rng.standard_normal((1, 1, 2048, 64)), rng.standard_normal((1, 1, 2048, 64)), np.array([2048]))
cache.append(rng.standard_normal((1, 1, 1, 64)), rng.standard_normal((1, 1, 1, 64)), np.array([1]))
live_k = cache.k[:, :, :2049].nbytes  # about 1 MiB
tracemalloc.start()
try:
    with quietly():
        gqa_attention(rng.standard_normal((1, 8, 1, 64)), cache, np.array([1]))
    _, peak = tracemalloc.get_traced_memory()
finally:
    tracemalloc.stop()
assert peak < 4 * live_k, (f"a decode step at G = 8 allocated {peak:,} B at its peak, {peak / live_k:.1f}x the live K: "
                           f"is K or V copied out to every query head?")
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

# No K/V copied per query head: peak bytes allocated by a decode step at G = 8 (the grader's probe).
with quietly():
    no_repeat = check("no_kv_repeat", KVCache, gqa_attention)
assert no_repeat.passed, no_repeat.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_decode", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["decode"]}
for cached in (1, 4, 9):
    full, step = prefill_then_chunk(cached, 1)
    assert np.allclose(step, full), f"decode after {cached} tokens differs from the full prefill's last row"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

with quietly():
    result = check("decode", KVCache, gqa_attention)
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_full_prefill", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["full_prefill"]}
r = np.random.default_rng(3)
k, v = r.standard_normal((2, 1, 1, 5, 4))
q = r.standard_normal((1, 2, 5, 4))  # MQA: 2 query heads over 1 KV head
cache = KVCache(1, 1, 5, 4, dtype=np.float64)
cache.append(k, v, np.array([5]))
out = gqa_attention(q, cache, np.array([5]))
assert out.shape == q.shape and out.dtype == q.dtype
assert np.allclose(out[0, :, 0], v[0, 0, 0]), "the first token sees only itself"
scores = k[0, 0] @ q[0, 1, 4] / math.sqrt(4)  # the last token sees all 5 keys
weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
assert np.allclose(out[0, 1, 4], weights @ v[0, 0]), "softmax(q k^T / sqrt(d)) v over keys 0 .. 4"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

with quietly():
    result = check("full_prefill", KVCache, gqa_attention)
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_chunked_prefill", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["chunked_prefill"]}
for cached, T in ((5, 3), (1, 2), (6, 4)):
    full, chunk = prefill_then_chunk(cached, T)
    assert np.allclose(chunk, full), \
        f"a chunk of {T} tokens after {cached} cached ones differs from the full prefill: is the mask offset?"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

with quietly():
    result = check("chunked_prefill", KVCache, gqa_attention)
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_ragged_rows", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["ragged_rows"]}
# Rows of 5, 2 and 3 tokens, prefilled in one padded call, then decode steps: each row of the batch
# must give what it gives alone (real slots only; padding is the next cell's business).
with quietly():
    calls = history(3, [[5, 2, 3], [1, 1, 1], [1, 1, 0]])
for out, outs, counts in calls:
    for b, n in enumerate(counts):
        assert np.allclose(out[b:b + 1, :, :n], outs[b][:, :, :n]), \
            f"row {b} of the batch differs from the row alone (tokens per row: {counts.tolist()})"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check_all


def refuses_chunks(KVCache, gqa_attention) -> bool:
    """Whether a chunk of 2 tokens after 2 cached ones is refused with a clear error, as kvkit grade tells one."""
    cache = KVCache(1, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    try:
        cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
        gqa_attention(np.ones((1, 1, 2, 2)), cache, np.array([2]))
    except (NotImplementedError, ValueError, TypeError):
        return True
    return False


with quietly():
    results = check_all(["decode", "full_prefill", "ragged_rows", "ragged_rows_unchunked"], KVCache, gqa_attention)
    # As kvkit grade judges ragged rows: on every ragged step, chunks after cached tokens included (so a chunk-local
    # mask fails here too), unless code whose decode and full prefill work refuses such chunks with a clear error:
    # that refusal is charged to test_chunked_prefill alone, and ragged rows are judged on the calls it leaves.
    refused = results["decode"].passed and results["full_prefill"].passed and refuses_chunks(KVCache, gqa_attention)
result = results["ragged_rows_unchunked" if refused else "ragged_rows"]
assert result.passed, result.message
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_padding", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["padding"]}
# A prefill of 4, 1 and 0 tokens in 4 slots, then a decode step that gives row 1 no token. (No chunk after
# cached tokens: a cache may refuse chunked prefill, which only test_chunked_prefill charges.)
with np.errstate(divide="raise", over="raise", invalid="raise"):
    calls = history(3, [[4, 1, 0], [1, 0, 1]])
for out, _, counts in calls:
    for b, n in enumerate(counts):
        assert np.isfinite(out[b]).all(), f"row {b} (tokens per row: {counts.tolist()}) has NaN or inf"
        assert not out[b, :, n:].any(), f"padded slots of row {b} must be exactly 0"
empty = KVCache(2, 2, 4, 4)
assert np.array_equal(gqa_attention(np.ones((2, 4, 3, 4), dtype=np.float32), empty, np.array([0, 0])),
                      np.zeros((2, 4, 3, 4))), "an all-empty cache gives zeros"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

result = check("padding", KVCache, gqa_attention)
assert result.passed, result.message
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "why", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 5}
# ## 6. Why: the cost of growing a cache by concatenation
#
# At each decode step the model appends one token's K and V (in every layer) and attends over
# everything so far. The first way most people grow the cache,
# `k = np.concatenate([k, k_new], axis=2)`, allocates a new array and copies every token that was
# already there. Step `i` (from 0) copies `i` tokens, so `n` steps copy `0 + 1 + ... + (n - 1)`
# tokens: quadratic in the length of the sequence, for work whose useful part, writing the new
# token, is linear.
#
# How much is that? One token of Llama 3.1 8B (32 layers, 8 KV heads, head dimension 128) in
# bf16 (2 bytes an element) adds `2 x 32 x 8 x 128 x 2 = 131,072` bytes across all layers (the
# first 2: K and V). Write the cost model. Every function returns integer bytes, except
# `copy_seconds`, which returns float seconds and counts every copied byte twice: it is read
# once and written once.

# %% nbgrader={"grade": false, "grade_id": "cost", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "cost"}
def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Bytes of K and V that one token adds across all layers."""
    ### BEGIN SOLUTION
    return 2 * layers * kv_heads * head_dim * bytes_per_element
    ### END SOLUTION


def concat_bytes_copied(tokens: int, bytes_per_token: int) -> int:
    """Bytes copied growing a cache by concatenation, one token per step, for `tokens` steps.

    Step i (from 0) copies the i tokens already there into a new buffer.
    """
    ### BEGIN SOLUTION
    return tokens * (tokens - 1) // 2 * bytes_per_token
    ### END SOLUTION


def cache_bytes(tokens: int, bytes_per_token: int) -> int:
    """Bytes a cache of `tokens` tokens holds."""
    ### BEGIN SOLUTION
    return tokens * bytes_per_token
    ### END SOLUTION


def copy_seconds(bytes_copied: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds (float) to copy `bytes_copied` bytes: each byte is read once and written once."""
    ### BEGIN SOLUTION
    return 2 * bytes_copied / bandwidth_bytes_per_s
    ### END SOLUTION


def reservation_bytes(rows: int, max_len: int, bytes_per_token: int) -> int:
    """Bytes reserved up front for `rows` rows of `max_len` tokens each."""
    ### BEGIN SOLUTION
    return rows * max_len * bytes_per_token
    ### END SOLUTION


def repeat_bytes(cache_bytes: int, group_size: int) -> int:
    """Bytes a materialised KV repeat writes per step: every KV head copied `group_size` times."""
    ### BEGIN SOLUTION
    return cache_bytes * group_size
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "cost_table_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The table your functions give for Llama 3.1 8B in bf16 (Meta's `config.json`), 4,096 decode steps,
# an H100 SXM (3.35 TB/s of HBM3, NVIDIA's datasheet), 32 rows of 8,192 tokens reserved, and a group
# size of 4:

# %% nbgrader={"grade": false, "grade_id": "cost_table", "locked": true, "schema_version": 3, "solution": false, "task": false}
LLAMA_8B = dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)
STEPS, H100_BYTES_PER_S = 4096, 3.35e12
MiB, GiB, TiB = 2**20, 2**30, 2**40

per_token = kv_bytes_per_token(**LLAMA_8B)
copied = concat_bytes_copied(STEPS, per_token)
final = cache_bytes(STEPS, per_token)
table = [
    ("KV bytes per token, all layers", f"{per_token:,} B"),
    (f"tokens copied by concatenation over {STEPS:,} decode steps", f"{copied // per_token:,}"),
    ("bytes copied", f"{copied:.2e} B (about {copied / TiB:.1f} TiB)"),
    ("final cache", f"{final / MiB:,.0f} MiB"),
    ("time at 3.35 TB/s (H100 SXM), read + write",
     f"{copy_seconds(copied, H100_BYTES_PER_S):.2f} s per sequence"),
    ("preallocated write per new token", f"{per_token:,} B, whatever the length"),
    ("reservation, 32 rows x 8,192 tokens", f"{reservation_bytes(32, 8192, per_token) / GiB:.0f} GiB"),
    ("materialized KV repeat, G = 4, 4,096-token row",
     f"{final / MiB:.0f} MiB of KV becomes {repeat_bytes(final, 4) / GiB:.0f} GiB per decode step"),
]
for quantity, value in table:
    print(f"{quantity:<58} {value}")

# %% nbgrader={"grade": true, "grade_id": "test_cost", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["cost_model"]}
# The figures of the table above.
assert kv_bytes_per_token(32, 8, 128, 2) == 131_072
assert concat_bytes_copied(4096, 131_072) == 8_386_560 * 131_072, "0 + 1 + ... + 4,095 tokens copied"
assert concat_bytes_copied(1, 131_072) == 0, "the first step has nothing to copy"
assert cache_bytes(4096, 131_072) == 512 * 2**20
assert abs(copy_seconds(concat_bytes_copied(4096, 131_072), 3.35e12) - 0.66) < 0.005
assert reservation_bytes(32, 8192, 131_072) == 32 * 2**30
assert repeat_bytes(512 * 2**20, 4) == 2 * 2**30
assert isinstance(concat_bytes_copied(4097, 3), (int, np.integer)), "integer bytes: divide with //"
assert isinstance(copy_seconds(10, 2), float)
### BEGIN HIDDEN TESTS
from solutions import cost as reference_cost

calls = [("kv_bytes_per_token", (1, 1, 1, 1)), ("kv_bytes_per_token", (80, 8, 128, 2)),
         ("kv_bytes_per_token", (32, 8, 128, 1)), ("concat_bytes_copied", (0, 7)),
         ("concat_bytes_copied", (2, 3)), ("concat_bytes_copied", (4097, 131_072)),
         ("concat_bytes_copied", (1001, 5)), ("cache_bytes", (0, 9)), ("cache_bytes", (8192, 327_680)),
         ("copy_seconds", (10**9, 1e9)), ("copy_seconds", (3, 4.0)),
         ("reservation_bytes", (1, 0, 5)), ("reservation_bytes", (64, 131_072, 131_072)),
         ("repeat_bytes", (0, 8)), ("repeat_bytes", (3 * 2**20, 7))]
for name, args in calls:
    want, got = getattr(reference_cost, name)(*args), globals()[name](*args)
    if name == "copy_seconds":
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-12), f"{name}{args} = {got!r}"
    else:
        assert isinstance(got, (int, np.integer)) and got == want, \
            f"{name}{args} = {got!r}, expected the integer {want!r}"
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "measure_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Measured, at a small scale
#
# The formula is a count; memory can be watched. Below, two toy caches for one layer (2 KV heads,
# head dimension 16, float32: `kv_bytes_per_token(1, 2, 16, 4)` = 256 bytes a token) receive the same
# 256 tokens, one per step. `ConcatCache` grows by `np.concatenate`; `PreallocatedCache` writes into
# buffers allocated once. `bytes_written` measures what one append does to memory by comparing it
# before and after: a new buffer was written whole (the old tokens copied, plus the new one); in a
# buffer that stayed, it counts the bytes that changed. The lines are your formulas: after `n` steps
# concatenation has written `concat_bytes_copied(n) + cache_bytes(n)` bytes (the copies, plus the new
# tokens themselves), preallocation `cache_bytes(n)`.

# %% nbgrader={"grade": false, "grade_id": "measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
class ConcatCache:
    """A one-row cache as it is often first written: every append builds new, longer arrays."""

    def __init__(self, kv_heads, head_dim):
        self.k = np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32)
        self.v = np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32)

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new], axis=2)
        self.v = np.concatenate([self.v, v_new], axis=2)


class PreallocatedCache:
    """A one-row cache allocated once: each append writes the new tokens in place."""

    def __init__(self, kv_heads, head_dim, max_len):
        self.k = np.zeros((1, kv_heads, max_len, head_dim), dtype=np.float32)
        self.v = np.zeros((1, kv_heads, max_len, head_dim), dtype=np.float32)
        self.length = 0

    def append(self, k_new, v_new):
        n = k_new.shape[2]
        self.k[:, :, self.length:self.length + n] = k_new
        self.v[:, :, self.length:self.length + n] = v_new
        self.length += n


def bytes_written(cache, k_new, v_new):
    """Bytes of K/V memory that `cache.append(k_new, v_new)` writes, measured before/after."""
    before = [(buffer, buffer.copy()) for buffer in (cache.k, cache.v)]
    cache.append(k_new, v_new)
    total = 0
    for (old, snapshot), new in zip(before, (cache.k, cache.v)):
        if new is not old:  # a new buffer: every byte of it was written
            total += new.nbytes
        else:  # the same buffer: count the elements that changed
            total += int(np.count_nonzero(new != snapshot)) * new.itemsize
    return total


SMALL_STEPS, SMALL_HKV, SMALL_D = 256, 2, 16
small_per_token = kv_bytes_per_token(1, SMALL_HKV, SMALL_D, 4)
concat_cache = ConcatCache(SMALL_HKV, SMALL_D)
prealloc_cache = PreallocatedCache(SMALL_HKV, SMALL_D, SMALL_STEPS)
measured = {"concatenation": [], "preallocation": []}
for _ in range(SMALL_STEPS):
    k_new = rng.standard_normal((1, SMALL_HKV, 1, SMALL_D)).astype(np.float32)
    v_new = rng.standard_normal((1, SMALL_HKV, 1, SMALL_D)).astype(np.float32)
    measured["concatenation"].append(bytes_written(concat_cache, k_new, v_new))
    measured["preallocation"].append(bytes_written(prealloc_cache, k_new, v_new))

steps = np.arange(1, SMALL_STEPS + 1)
formula = {
    "concatenation": [concat_bytes_copied(n, small_per_token) + cache_bytes(n, small_per_token) for n in steps],
    "preallocation": [cache_bytes(n, small_per_token) for n in steps],
}
fig, ax = plt.subplots(figsize=(7.5, 4.2))
for name, color in (("concatenation", "tab:red"), ("preallocation", "tab:blue")):
    ax.plot(steps, formula[name], color=color, label=f"{name}, formula")
    ax.plot(steps, np.cumsum(measured[name]), "o", color=color, markevery=16, fillstyle="none",
            label=f"{name}, measured")
ax.set_xlabel("decode step n")
ax.set_ylabel("bytes written to K/V memory, total after n steps")
ax.set_title(f"Growing a cache one token at a time ({small_per_token} B per token)")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

copies = sum(measured["concatenation"]) - sum(measured["preallocation"])
print(f"after {SMALL_STEPS} steps: concatenation wrote {sum(measured['concatenation']):,} B, "
      f"preallocation {sum(measured['preallocation']):,} B")
print(f"measured copies {copies:,} B; concat_bytes_copied({SMALL_STEPS}, {small_per_token}) = "
      f"{concat_bytes_copied(SMALL_STEPS, small_per_token):,} B")

# %% [markdown] nbgrader={"grade": false, "grade_id": "why_conclusion", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Concatenation's curve is a parabola, preallocation's a straight line, and the measurement sits on
# your formulas. At the scale of the table the parabola is about a tebibyte, 0.66 s of pure copying
# per 4,096-token sequence on an H100, against 131,072 bytes per new token written in place. That is
# rule 1: allocate the cache once, write each token once.

# %% [markdown] nbgrader={"grade": false, "grade_id": "torch_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 6}
# ## 7. The PyTorch port
#
# The same contract over torch tensors, on any device: `KVCacheTorch(batch, kv_heads, max_len, head_dim,
# dtype=torch.float32, device=None)` with `k`, `v` and `lens` as tensors, and `gqa_attention_torch(q,
# cache, n_new)`. It runs on the GPU when there is one. What changes from NumPy is where copies hide:
#
# * The buffers are allocated once and written with slice assignment or `copy_`; nothing grows by
#   `torch.cat`.
# * The broadcasting form that was free in NumPy is not free in PyTorch:
#   `q.view(B, Hkv, G, T, d) @ k.unsqueeze(2).transpose(-1, -2)` makes `torch.matmul` expand K over
#   the group axis and **materialise** it (an `aten.clone` of G copies of the K slice) before it calls
#   `bmm`: a hidden repeat. Fold the group into the rows instead,
#   `q.reshape(B, Hkv, G * T, d) @ k.transpose(-1, -2)`: row `g * T + t` of KV head `j` is query head
#   `j * G + g` at slot `t`, and it runs one `bmm` with no copy. (`scaled_dot_product_attention(...,
#   enable_gqa=True)` is the fused alternative; give it the bottom-right mask, never `is_causal=True`.)
# * `torch.softmax` over a row of `-inf` gives NaN: zero the masked weights afterwards (`masked_fill`).
#
# You can see the hidden repeat by watching the ops torch runs, which is how the grader checks the port:

# %% nbgrader={"grade": false, "grade_id": "torch_setup", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"role": "port"}
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"

# %% nbgrader={"grade": false, "grade_id": "torch_ops_demo", "locked": true, "schema_version": 3, "solution": false, "task": false}
from kv_helpers.opwatch import OpWatch  # the kit's op recorder (the grader's and the learner's step 6 use it too)


B_, HKV_, G_, T_, S_, D_ = 1, 2, 4, 1, 512, 64
q_demo, k_demo = torch.randn(B_, HKV_ * G_, T_, D_), torch.randn(B_, HKV_, S_, D_)
with OpWatch() as broadcast:
    scores_broadcast = q_demo.view(B_, HKV_, G_, T_, D_) @ k_demo.unsqueeze(2).transpose(-1, -2)
with OpWatch() as folded:
    scores_folded = q_demo.reshape(B_, HKV_, G_ * T_, D_) @ k_demo.transpose(-1, -2)
assert torch.allclose(scores_broadcast.reshape(scores_folded.shape), scores_folded, atol=1e-4)
print(f"K holds {k_demo.numel():,} elements")
for name, recorder in (("broadcast over G", broadcast), ("G folded into rows", folded)):
    # _unsafe_view reshapes without copying, though its schema does not say "view".
    ops = [(op.packet.split(".")[-1], op.numel, op.aliases) for op in recorder.ops]
    copies = [(op, n) for op, n, view in ops if not view and op != "_unsafe_view" and n >= k_demo.numel()]
    print(f"{name:>20}: ops {[op for op, _, _ in ops]}\n{'':>22}copies as large as K: {copies}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "torch_write", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Write the port: the three rules again, over torch tensors, then the cache and the attention.
# `group_queries_torch` folds the group into the rows; `visible_keys_torch` is `visible_keys` with
# `torch.arange` on the cache's device; `softmax_visible_torch` zeroes what `torch.softmax` leaves NaN.
# `check_counts_torch` validates `n_new` (a tensor, an array or a sequence) and returns it as an int64
# tensor on the cache's device; use it.

# %% nbgrader={"grade": false, "grade_id": "torch_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"role": "port"}
def check_counts_torch(n_new, batch: int, limit: int, device, name: str = "n_new") -> torch.Tensor:
    """`check_counts` for the port: `n_new` (a tensor, an array or a sequence) as an int64 tensor `[batch]`
    on `device`, each count in 0..limit; ValueError (TypeError for non-integers) otherwise."""
    counts = torch.as_tensor(n_new)
    if tuple(counts.shape) != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {tuple(counts.shape)}")
    if batch and (counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got dtype {counts.dtype}")
    counts = counts.to(device=device, dtype=torch.int64)
    bad = torch.nonzero((counts < 0) | (counts > limit)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(counts[b])} is outside 0..T={limit}")
    return counts


# %% nbgrader={"grade": false, "grade_id": "torch_port", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "port", "exports": {"KVCache": "KVCacheTorch", "gqa_attention": "gqa_attention_torch"}}
def group_queries_torch(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """View q `[B, Hq, T, d]` as `[B, Hkv, G * T, d]`: row `g * T + t` of KV head `j` is query head
    `j * G + g` at slot `t`.

    Raises:
        ValueError: `Hq` is not a positive multiple of `kv_heads`.
    """
    ### BEGIN SOLUTION
    B, Hq, T, d = q.shape
    if Hq == 0 or Hq % kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={kv_heads}")
    return q.reshape(B, kv_heads, Hq // kv_heads * T, d)
    ### END SOLUTION


def visible_keys_torch(lens: torch.Tensor, n_new: torch.Tensor, T: int, S: int) -> torch.Tensor:
    """`visible_keys` over torch tensors: bool `[B, T, S]` on the device of `lens` (lens, n_new: int64 `[B]`)."""
    ### BEGIN SOLUTION
    t = torch.arange(T, device=lens.device)
    # Positions count from the start of the row, not of the chunk: the cached keys are visible too.
    position = (lens - n_new)[:, None] + t
    real = t < n_new[:, None]
    return (torch.arange(S, device=lens.device) <= position[:, :, None]) & real[:, :, None]
    ### END SOLUTION


def softmax_visible_torch(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """`softmax_visible` over torch tensors: `torch.softmax` over the visible entries, a row that sees
    nothing exactly 0 (torch.softmax gives it NaN)."""
    ### BEGIN SOLUTION
    hidden = ~visible
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    # torch.softmax of a row that is all -inf is NaN; its weights are 0 by the contract.
    return weights.masked_fill(hidden, 0.0)
    ### END SOLUTION


class KVCacheTorch:
    """K/V tensors `[B, Hkv, max_len, d]` on `device`, allocated once; `lens` an int64 tensor `[B]`."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None):
        ### BEGIN SOLUTION
        for name, value, low in (("batch", batch, 0), ("kv_heads", kv_heads, 1),
                                 ("max_len", max_len, 0), ("head_dim", head_dim, 1)):
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        shape = (int(batch), int(kv_heads), int(max_len), int(head_dim))
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = torch.zeros(int(batch), dtype=torch.int64, device=self.k.device)
        ### END SOLUTION

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, n_new) -> None:
        """Write the first `n_new[b]` tokens of each row at `lens[b]`, in place (see `KVCache.append`)."""
        ### BEGIN SOLUTION
        B, Hkv, max_len, d = self.k.shape
        if k_new.dim() != 4 or tuple(k_new.shape[:2]) != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = check_counts_torch(n_new, B, k_new.shape[2], self.lens.device)
        end = self.lens + n_new
        over = torch.nonzero(end > max_len).flatten()
        if over.numel():
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        # Every row fits, so no write below can fail half-way through the batch.
        for b, (start, stop) in enumerate(zip(self.lens.tolist(), end.tolist())):
            self.k[b, :, start:stop].copy_(k_new[b, :, :stop - start])
            self.v[b, :, start:stop].copy_(v_new[b, :, :stop - start])
        # Last, so that no row ever claims a token it has not stored.
        self.lens.copy_(end)
        ### END SOLUTION


def gqa_attention_torch(q: torch.Tensor, cache: KVCacheTorch, n_new) -> torch.Tensor:
    """`gqa_attention` over torch tensors: bottom-right mask, no KV repeat, padded slots exactly 0."""
    ### BEGIN SOLUTION
    B, Hkv, _, d = cache.k.shape
    if q.dim() != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    Hq, T = q.shape[1], q.shape[2]
    qf = group_queries_torch(q, Hkv)
    n_new = check_counts_torch(n_new, B, T, cache.lens.device)
    short = torch.nonzero(n_new > cache.lens).flatten()
    if short.numel():
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(cache.lens[b])} tokens")

    # The live length, not max_len: keys past the longest row are empty for every row.
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return torch.zeros_like(q)
    k, v = cache.k[:, :, :S], cache.v[:, :, :S]
    G = Hq // Hkv
    scores = (qf @ k.transpose(-1, -2) / math.sqrt(d)).view(B, Hkv, G, T, S)
    visible = visible_keys_torch(cache.lens, n_new, T, S)[:, None, None]
    weights = softmax_visible_torch(scores, visible).view(B, Hkv, G * T, S)
    return (weights @ v).reshape(B, Hq, T, d)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_torch_port", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["torch_port"]}
r = torch.Generator().manual_seed(4)
Hkv_t, G_t, d_t, cached, T = 2, 3, 8, 5, 3
k_all = torch.randn(1, Hkv_t, cached + T, d_t, generator=r, dtype=torch.float64).to(device)
v_all = torch.randn(1, Hkv_t, cached + T, d_t, generator=r, dtype=torch.float64).to(device)
q_all = torch.randn(1, Hkv_t * G_t, cached + T, d_t, generator=r, dtype=torch.float64).to(device)
whole = KVCacheTorch(1, Hkv_t, cached + T, d_t, dtype=torch.float64, device=device)
whole.append(k_all, v_all, torch.tensor([cached + T]))
full = gqa_attention_torch(q_all, whole, torch.tensor([cached + T]))
split = KVCacheTorch(1, Hkv_t, cached + T, d_t, dtype=torch.float64, device=device)
k_buffer, k_pointer = split.k, split.k.data_ptr()
split.append(k_all[:, :, :cached], v_all[:, :, :cached], torch.tensor([cached]))
split.append(k_all[:, :, cached:], v_all[:, :, cached:], torch.tensor([T]))
chunk = gqa_attention_torch(q_all[:, :, cached:], split, torch.tensor([T]))
assert split.k is k_buffer and split.k.data_ptr() == k_pointer, "append must write into the buffer allocated once"
assert chunk.device == q_all.device and chunk.dtype == q_all.dtype
assert torch.allclose(chunk, full[:, :, cached:]), "a chunk after cached tokens must match the full prefill"
### BEGIN HIDDEN TESTS
from grader.inprocess.checks import check

torch.set_num_threads(1)  # thousands of tiny ops: one thread is fastest, and immune to oversubscription


from grader.inprocess.checks import torch_as_numpy

facing = torch_as_numpy(KVCacheTorch, gqa_attention_torch)  # NumPy in and out, so every check applies
for name in ("decode", "full_prefill", "chunked_prefill", "ragged_rows", "padding"):
    result = check(name, *facing)
    assert result.passed, f"PyTorch port, {name}: {result.message}"
# In place and no hidden repeat, from the ops a one-token append and a decode step run (the grader's probe).
result = check("torch_ops", KVCacheTorch, gqa_attention_torch)
assert result.passed, result.message
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "own_md", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"step": 7}
# ## 8. Check yourself against a direct reference
#
# The checks above caught what they were written to catch. Your own test is what catches the rest,
# and the test that matters compares your code with a **direct reference** on **chunked** inputs: a
# test that only tries decode and full prefill passes a chunk-local mask. Write:
#
# * `reference_attention(q, k, v, lens, n_new)`: written for obviousness, never for speed. Upcast to
#   float64, repeat the KV heads outright (`np.repeat(k, G, axis=1)` is fine here), and for each row,
#   head and real query slot, take a plain softmax over keys `0 ..` its position. Padded slots are 0.
# * `check_against_reference(KVCache, gqa_attention, trials=30, seed=0)`: drives the given
#   implementation through random histories (rows of different lengths, chunks of 1 to 4 tokens after
#   cached ones, rows that get no token, `G` from 1 to 4), keeps its own copy of every token appended,
#   and uses `assert` to compare each output with `reference_attention` on that copy. It raises
#   `AssertionError` at the first disagreement and returns `None` when all agree. Also assert that
#   `append` keeps the buffers and moves `lens` right, and that an append past `max_len` raises
#   `ValueError` and changes nothing.
#
# The cell after yours wraps your check in a pytest test, `test_check_against_reference`: handed in to
# `kvkit grade`, this notebook's check is run as your own test, on your code and on each planted mistake.
# The two graders judge it differently: `test_own_check` grades your check on the kit's reference
# implementation, so a mistake in your code costs only its own cells; `kvkit grade` runs it on your code
# first, and a check that fails there (even rightly, on a mistake of your code) earns its points only
# once the code passes it.

# %% nbgrader={"grade": false, "grade_id": "own_check", "locked": false, "schema_version": 3, "solution": true, "task": false} kvkit={"role": "own_tests"}
def reference_attention(q, k, v, lens, n_new):
    """Expected output `[B, Hq, T, d]` (float64) for queries q of the tokens just appended.

    k, v: `[B, Hkv, L, d]` with row b valid in `[:lens[b]]`; lens after the append; padded slots 0.
    """
    ### BEGIN SOLUTION
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, T, d = q.shape
    G = Hq // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    out = np.zeros((B, Hq, T, d))
    for b in range(B):
        for h in range(Hq):
            for t in range(int(n_new[b])):
                position = int(lens[b]) - int(n_new[b]) + t
                scores = k[b, h, :position + 1] @ q[b, h, t] / math.sqrt(d)
                weights = np.exp(scores - scores.max())
                out[b, h, t] = weights @ v[b, h, :position + 1] / weights.sum()
    return out
    ### END SOLUTION


def check_against_reference(KVCache, gqa_attention, trials=30, seed=0):
    """Assert that `KVCache`/`gqa_attention` agree with `reference_attention` on random chunked histories."""
    ### BEGIN SOLUTION
    r = np.random.default_rng(seed)
    # Overflow: row 1 is full, row 0 has room; the append must be refused and change nothing.
    cache = KVCache(2, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((2, 1, 4, 2)), np.ones((2, 1, 4, 2)), np.array([1, 4]))
    before = np.array(cache.k, copy=True)
    try:
        cache.append(np.full((2, 1, 2, 2), 7.0), np.full((2, 1, 2, 2), 7.0), np.array([2, 1]))
    except ValueError:
        pass
    else:
        raise AssertionError("an append past max_len raised nothing")
    assert np.asarray(cache.lens).tolist() == [1, 4], "a failed append moved lens"
    assert np.array_equal(np.asarray(cache.k), before), "a failed append wrote K"

    for trial in range(trials):
        B, Hkv, G, d, max_len = int(r.integers(1, 4)), int(r.integers(1, 3)), int(r.integers(1, 5)), 4, 10
        cache = KVCache(B, Hkv, max_len, d, dtype=np.float64)
        k_buffer = cache.k
        mine_k, mine_v = np.zeros((B, Hkv, max_len, d)), np.zeros((B, Hkv, max_len, d))
        lens = np.zeros(B, dtype=np.int64)
        while (lens < max_len).any():
            T = int(r.integers(1, 5))
            n_new = np.minimum(r.integers(0, T + 1, size=B), max_len - lens)
            k_new, v_new = r.standard_normal((2, B, Hkv, T, d))
            q = r.standard_normal((B, Hkv * G, T, d))
            cache.append(k_new, v_new, n_new)
            for b in range(B):
                mine_k[b, :, lens[b]:lens[b] + n_new[b]] = k_new[b, :, :n_new[b]]
                mine_v[b, :, lens[b]:lens[b] + n_new[b]] = v_new[b, :, :n_new[b]]
            lens = lens + n_new
            got = np.asarray(gqa_attention(q, cache, n_new))
            want = reference_attention(q, mine_k, mine_v, lens, n_new)
            where = f"trial {trial}: B={B}, Hkv={Hkv}, G={G}, lens={lens.tolist()}, n_new={n_new.tolist()}, T={T}"
            assert cache.k is k_buffer, f"append replaced the K buffer ({where})"
            assert np.asarray(cache.lens).tolist() == lens.tolist(), f"lens is wrong ({where})"
            assert got.shape == want.shape, f"output shape {got.shape}, expected {want.shape} ({where})"
            assert np.allclose(got, want, rtol=1e-9, atol=1e-9), f"output differs from the reference ({where})"
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "own_check_run", "locked": true, "schema_version": 3, "solution": false, "task": false} kvkit={"role": "own_tests"}
def test_check_against_reference():
    """Your check as a pytest test: `kvkit grade` runs it on your code and on each planted mistake."""
    check_against_reference(KVCache, gqa_attention)


if __name__ == "__main__":  # here in the notebook; `kvkit grade` imports this cell as a test module instead
    test_check_against_reference()
    print("your implementation passes your check")

# %% [markdown] nbgrader={"grade": false, "grade_id": "own_mutants_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the other way round: does your check fail when the code is wrong? `kv_helpers.mutants.plant`
# (released with this notebook, in `kv_helpers/`) takes your implementation and plants one known
# mistake around it (the kit's catalogue of the mistakes people make with this exercise). A good
# check catches all of them; it must catch `chunk_local_mask`.

# %% nbgrader={"grade": false, "grade_id": "own_mutants", "locked": true, "schema_version": 3, "solution": false, "task": false}
from kv_helpers.mutants import PLANTED, kill_matrix, plant

outcomes = {}  # as pytest's exit codes: 1 caught (your check failed), 0 missed, None broke
for mistake in PLANTED:
    planted_cache, planted_attention = plant(mistake, KVCache, gqa_attention)
    try:
        check_against_reference(planted_cache, planted_attention)
        outcomes[mistake] = 0
    except AssertionError:
        outcomes[mistake] = 1
    except Exception as error:  # the check itself broke on this mutant
        outcomes[mistake] = None
        print(f"{mistake}: your check raised {type(error).__name__}: {error}")
matrix = kill_matrix(outcomes)
print(matrix["summary"])

# %% nbgrader={"grade": true, "grade_id": "test_own_check", "locked": true, "points": 7, "schema_version": 3, "solution": false, "task": false} kvkit={"criteria": ["own_tests"]}
from kv_helpers.mutants import plant

try:
    with quietly():
        check_against_reference(*plant("chunk_local_mask", KVCache, gqa_attention))
except AssertionError:
    pass
else:
    raise AssertionError("your check passes a chunk-local mask: feed it chunks after cached tokens (1 < T < S)")
### BEGIN HIDDEN TESTS
# The check itself is graded, on the kit's reference implementation: it must pass there and catch the
# chunk-local mask planted around it, whatever the state of the code above. The kit's own mutants, not
# the copy beside the notebook (nbgrader puts the released one back, but a grader takes no chances).
from catalogue.mutants import plant
from solutions.kv_cache import KVCache as ReferenceCache, gqa_attention as reference_gqa

check_against_reference(ReferenceCache, reference_gqa, seed=1)
try:
    check_against_reference(*plant("chunk_local_mask", ReferenceCache, reference_gqa), seed=1)
except AssertionError:
    pass
else:
    raise AssertionError("check_against_reference does not catch the chunk-local mask")
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 9. Where the contiguous cache stops
#
# The cache you built reserves `max_len` tokens for every row: `reservation_bytes(32, 8192, 131072)` is
# 32 GiB for 32 rows of Llama 3.1 8B. That is right when rows have similar lengths. When they differ
# wildly, a 100-token chat next to a 100,000-token document, most of the reservation sits empty and
# the max-length attention wastes most of its FLOPs on masked keys. That is where block tables and
# paged kernels take over (PagedAttention in vLLM, `flash_attn_with_kvcache` with a block table). This
# notebook stops at the contiguous version.
#
# Two questions to take with you. MQA and MHA are the ends of the same code: which values of `Hkv`
# and `G`? And if decode is slower than expected at batch 64, what do you check first? (That attention
# runs over `lens.max()` keys, not over `max_len`.)
