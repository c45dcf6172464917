"""The PyTorch port of kv_cache.py: your code (step 6).

The same two names and the same rules as ``kv_cache.py``, over torch tensors,
on any device: CUDA when one is there, the CPU otherwise. What changes from
NumPy is where copies hide, and step 6 watches every op your code runs:

* ``append`` writes into the buffers allocated in ``__init__``; it never
  grows them with ``torch.cat``/``torch.stack`` or builds a new tensor the
  size of the cache.
* ``gqa_attention`` never materialises K or V per query head: no
  ``repeat``/``repeat_interleave``/``expand(...).contiguous()`` of them, and
  no op whose result is G times the live K. Careful: ``torch.matmul`` copies
  an operand it has to broadcast, so a shape that looks like a view can still
  copy K G times.
* The mask is the bottom-right aligned causal one (rule 3 of kv_cache.py).
  ``scaled_dot_product_attention(..., is_causal=True)`` is top-left aligned
  when T != S, which is wrong for chunked prefill and decode.
"""
from __future__ import annotations

import torch


class KVCache:
    """The keys and values of one layer, for B rows, in tensors allocated once on ``device``.

    Args:
        batch, kv_heads, max_len, head_dim: B, Hkv, max_len, d as in kv_cache.py.
        dtype: element type of the buffers (default torch.float32).
        device: where the buffers live (default: torch's default device, the CPU).

    Attributes:
        k, v: tensors [B, Hkv, max_len, d] of ``dtype`` on ``device``, never replaced.
        lens: int64 tensor [B] on the same device, 0 at first.

    Raises:
        ValueError: a size that makes no sense (negative, or no KV head).
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None):
        raise NotImplementedError("step 6: the PyTorch KVCache.__init__ allocates k, v and lens on the device")

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, n_new) -> None:
        """Store each row's n_new[b] real tokens at lens[b], in place (as in kv_cache.py).

        Args:
            k_new, v_new: tensors [B, Hkv, T, d] on the cache's device.
            n_new: int tensor (or sequence) [B], 0 <= n_new[b] <= T.

        Raises:
            ValueError (or TypeError) naming the argument for a bad shape or count;
            ValueError when a row would pass max_len, and then nothing changes.
        """
        raise NotImplementedError("step 6: the PyTorch KVCache.append writes in place at each row's length")


def gqa_attention(q: torch.Tensor, cache: KVCache, n_new) -> torch.Tensor:
    """Causal GQA of the tokens just appended (as in kv_cache.py), over torch tensors.

    Args:
        q: [B, Hq, T, d] on the cache's device, Hq = G * Hkv.
        cache: the KVCache the matching K/V were just appended to.
        n_new: int tensor (or sequence) [B], the counts given to that append.

    Returns:
        A tensor [B, Hq, T, d] in q's dtype on q's device; padded slots exactly 0.

    Raises:
        ValueError (or TypeError) naming the argument, as in kv_cache.py.
    """
    raise NotImplementedError("step 6: the PyTorch gqa_attention is not written yet")
