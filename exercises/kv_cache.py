"""Grouped-query attention over a KV cache allocated once (NumPy): your code.

Fill in the bodies step by step; `kvkit progress` (or `python progress.py` in
a starter bundle) says which step is next and what its first failing check
saw. Keep the names and argument orders: the tests and the grader call them.

Names for sizes, used in every docstring and test message:

    B     rows in the batch (sequences decoded together)
    Hkv   KV heads (``kv_heads``)
    G     query heads per KV head, the group size; Hq = G * Hkv query heads
    d     head dimension (``head_dim``)
    T     token slots per call; row b uses the first n_new[b], the rest is padding
    S     live keys: the longest row's length, lens.max()

The rules your code must keep:

1. K and V are written once, at the row's current length, and never moved or
   copied afterwards. The buffers are allocated once, in ``__init__``.
2. Query head h reads KV head h // G: query heads come in contiguous groups of
   G that share one KV head. K and V are never copied out per query head.
3. Query t of a call that appended n_new[b] tokens to row b sits at absolute
   position lens[b] - n_new[b] + t (lens counted after the append) and sees
   keys 0 .. that position, and nothing else.
"""
from __future__ import annotations

import numpy as np


class KVCache:
    """The keys and values of one attention layer, for B rows, in buffers allocated once.

    Args:
        batch: B, the number of rows.
        kv_heads: Hkv, the number of KV heads.
        max_len: the most tokens a row can ever hold.
        head_dim: d.
        dtype: the element type of the buffers (default float32).

    Attributes (what the tests and the grader read):
        k, v: arrays of shape [B, Hkv, max_len, d] and ``dtype``, allocated
            here and only ever written into afterwards (never replaced).
        lens: int64 array of shape [B]: how many tokens each row holds (0 at first).

    Raises:
        ValueError: a size that makes no sense (negative, or no KV head).
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=np.float32):
        raise NotImplementedError("step 1: KVCache.__init__ allocates k, v and lens (see its docstring)")

    def append(self, k_new: np.ndarray, v_new: np.ndarray, n_new) -> None:
        """Store each row's new tokens right after the ones it already holds.

        Args:
            k_new, v_new: [B, Hkv, T, d]. Slot t of row b is a real token when
                t < n_new[b]; the slots after it are padding and are not stored.
            n_new: int array [B], 0 <= n_new[b] <= T (0: the row gets nothing).

        Effect: row b's real tokens land at positions lens[b] .. lens[b] +
        n_new[b] - 1 of ``k`` and ``v`` (lens before the call), and lens[b]
        grows by n_new[b]. Nothing else in the buffers changes.

        Raises:
            ValueError (or TypeError), naming the argument and the shapes: k_new
                not [B, Hkv, T, d] for this cache, v_new not k_new's shape,
                n_new not of length B or a count outside 0..T.
            ValueError: some row would pass max_len. Then nothing changes, not
                lens and not any row: check every row before writing any.
        """
        raise NotImplementedError("step 1: KVCache.append writes the new tokens at each row's length")


def gqa_attention(q: np.ndarray, cache: KVCache, n_new) -> np.ndarray:
    """Causal grouped-query attention of the tokens just appended, over everything their row holds.

    Args:
        q: [B, Hq, T, d] queries, Hq = G * Hkv. Slot t of row b is the query of
            the token the last ``append`` put in slot t.
        cache: the KVCache those tokens were just appended to (its lens counts them).
        n_new: int array [B], the counts given to that ``append``.

    Returns:
        [B, Hq, T, d] in q's dtype. For query head h, slot t < n_new[b] of row b:
        the softmax over the keys it may see of (q . k) / sqrt(d), applied to
        their values, where it reads KV head h // G (rule 2) and may see keys
        0 .. lens[b] - n_new[b] + t of its own row (rule 3), never a key at or
        past lens[b]. Slots t >= n_new[b] are padding: their output is exactly
        0, never NaN. So is every slot of a row with n_new[b] = 0, and the whole
        result when B = 0, T = 0 or the cache is empty. No floating-point
        warnings, whatever the padding.

    Cost: reads the live keys (the longest row's length), not all of max_len,
    and never copies K or V per query head.

    Raises:
        ValueError (or TypeError), naming the argument and the shapes: Hq not a
            multiple of Hkv, B or d not the cache's, n_new not of length B or a
            count outside 0..T, or n_new[b] > lens[b].
    """
    raise NotImplementedError("step 2: gqa_attention is not written yet (steps 2, 3 and 4 fill it)")
