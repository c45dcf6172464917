"""A tuned GQA attention over the kit's KV cache, NumPy and PyTorch: the benchmark's copy, not the reading one.

``solutions/kv_cache.py`` and ``solutions/kv_cache_torch.py`` are written to be
read; this module is written to be timed. Same contract (docs/contract.md):
``q`` ``[B, Hq, T, d]``, a cache with ``k``, ``v`` ``[B, Hkv, max_len, d]`` and
``lens`` int64 ``[B]`` (lengths after the append), ``n_new`` int ``[B]``; query
head ``h`` reads KV head ``h // G``; query ``t`` of row ``b`` sits at
``lens[b] - n_new[b] + t`` and sees keys ``0 ..`` that position (bottom-right
causal mask); padded slots ``t >= n_new[b]`` are exactly 0; any ``T``, ragged
rows, rows with no new token. float32 and float64 in both; bfloat16/float16
in torch (scores softmaxed in float32). The output is in q's dtype and never a
view of a buffer kept between calls.

``tuned_numpy(q, cache, n_new)`` and ``tuned_torch(q, cache, n_new)`` take the
reading copy's caches (``solutions.kv_cache.KVCache``,
``solutions.kv_cache_torch.KVCache``), or any object with ``k``, ``v``, ``lens``.

What each trick buys, measured on the decode figure of ``kvkit bench``
(B = 8, Hkv = 8, G = 4, d = 128, T = 1, 4,096 live keys of 8,192 reserved,
float32: 256 MiB of live K/V per step) on this kit's machine (2 cores of an
Intel Xeon, 2026-12-01, torch 2.13.0+cpu with 2 OpenMP threads, NumPy 2.4.6
with OpenBLAS, 2 threads), by ``python -m benchmarks.tuned_ablation``: the
decode core with one trick undone at a time, every variant interleaved with
the others, fastest of 20 rounds, two runs (the machine is shared and noisy:
each figure is a ratio within one run, and the two runs' ratios are given).

PyTorch. Tuned step 16.5 / 13.4 ms; the reading copy 1.40x / 1.67x that, SDPA
``enable_gqa=True`` 2.23x / 2.17x; summing a 512 MiB array with ``torch.sum``
took 1.36x / 1.50x the step, so the step read its 256 MiB at 68% / 75% of
that rate.

- **the group folded into the rows**: ``[B*Hkv, G*T, d] @ [B*Hkv, d, S]``, one
  ``bmm`` of 64 ``[4, 128] @ [128, 4096]`` products; K is read once per KV head,
  never expanded (the broadcasting ``q.view(B, Hkv, G, T, d) @ k[:, :, None]``
  form makes ``matmul`` copy K G times; repeat-then-attend, in the bench,
  is 13x slower than even the reading copy).
- **``q @ Kᵀ`` rather than ``K @ qᵀ``** (a transposed view of K either way, no
  copy): ``K @ qᵀ`` is 1.18x / 1.13x slower. On this Intel machine MKL's ``bmm``
  reads K faster as the transposed right operand; the reading copy uses
  ``K @ qᵀ``, measured the faster on the AMD EPYC it was written on, so the
  order is a property of the BLAS and the CPU, not of the algorithm.
- **scores in a buffer kept between calls** (``bmm(..., out=)``, then
  ``torch.softmax(..., out=)`` in place): fresh scores and weights tensors
  (4 MiB each, page faults on first touch) are 1.06x / 1.03x slower.
- **no mask when it would hide nothing**: in a decode step where every row
  holds ``lens == S`` keys and one real query, that query sees every key, so
  the mask from ``lens`` and a ``masked_fill`` pass over the scores are skipped;
  building and applying it is 1.05x / 1.21x slower. Ragged rows, chunks and
  padding take the masked path.
- **scale q, not the scores**: ``B*Hq*T*d`` multiplications instead of
  ``B*Hq*T*S``; within the noise here (0.94x / 0.99x), kept because it is free.
- **padding zeroed on the output**: padded query slots are left unmasked (so no
  row of the softmax is all ``-inf`` and nothing is NaN) and their output rows
  set to 0 afterwards, one ``masked_fill`` of ``[B, Hq, T, d]``.
- **threads**: torch's default (2 on 2 cores) is right: 1 thread is 1.52x /
  1.85x slower. ``torch.inference_mode`` around the call: 0.96x / 0.97x, within
  the noise for a dozen ops, so the function leaves autograd mode to the caller
  (the bench runs it in inference mode). Validation and the chunk plan cost
  about 70 us a call (measured at a toy size with one thread).

Both products are memory-bound, and there the tuned step stops: in the bench's
op profile the ``q @ Kᵀ`` ``bmm`` reads K at 14-18 GB/s and the ``P @ V`` one
reads V at 19-23 GB/s, while ``torch.sum`` reads a 512 MiB array at 21-27 GB/s
in the same runs; the softmax, the scale and Python take under 1 ms of the
step. A fused kernel (one pass over K and V, no scores in memory) would be the
next step; there is none in CPU torch for this shape (SDPA's CPU kernel is
slower here) and compiling one was out of scope.

NumPy. Tuned step 26.4 / 23.3 ms; the reading copy 1.50x / 1.25x that. OpenBLAS
is the limit: both products run at 9-12 GB/s in every orientation tried. The
tricks: ``K @ qᵀ`` into the kept buffer, then one transposing copy into a
second one (``q @ Kᵀ`` is 1.41x / 1.26x slower; the reading copy's
group-broadcast vector-matrix form 1.13x / 0.98x, a tie); the kept buffers
(fresh arrays 1.13x / 1.07x slower); the mask skipped as above (1.04x / 1.03x);
the softmax normalising the 128 KiB output instead of the 4 MiB weights (1.04x
/ 1.03x in one run, 0.95x in the other: noise). Splitting the heads over two
Python threads with one OpenBLAS thread each does not help: this OpenBLAS
serialises concurrent calls.

Prefill and long chunks: the query axis is cut into chunks so that the scores
of one chunk fit ``workspace_bytes`` (64 MiB by default), and each chunk reads
only the keys its last query can see (``max_b(lens[b] - n_new[b] + t1)``), so a
full prefill never materialises ``[B, Hq, T, S]`` scores and skips most of the
upper triangle. Measured once (quiet machine, fastest of 4): a prefill of
T = S = 2,048 at B = 1, Hkv = 8, G = 4, d = 128, float32 (the reading copies
build 512 MiB of scores) took 314 ms tuned against 1,504 ms for the reading
port (SDPA ``is_causal=True, enable_gqa=True``, which has the square mask
right for T = S only, 228 ms), and 642 ms tuned against 5,979 ms for the
NumPy reading copy. The buffer is kept per thread, per device and dtype
(``clear_workspace()`` frees it); a chunk of one query slot whose scores
exceed the budget is allocated per call instead.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

WORKSPACE_BYTES = 64 * 2**20

_local = threading.local()


def clear_workspace() -> None:
    """Drop this thread's kept scores buffers (both NumPy's and torch's)."""
    _local.__dict__.pop("buffers", None)


def _workspace(key: tuple, numel: int, nbytes: int, budget: int, alloc):
    """A 1-D buffer of at least ``numel`` elements: kept between calls when ``nbytes <= budget``."""
    if nbytes > budget:
        return alloc(numel)
    store = _local.__dict__.setdefault("buffers", {})
    buf = store.get(key)
    if buf is None or buf.shape[0] < numel:
        buf = alloc(numel)
        store[key] = buf
    return buf[:numel]


def _counts(n_new, batch: int, limit: int) -> list[int]:
    """``n_new`` as a list of ints, validated: shape ``[batch]``, integers, ``0 <= n <= limit``."""
    if hasattr(n_new, "detach"):  # a torch tensor
        if tuple(n_new.shape) != (batch,):
            raise ValueError(f"n_new must have shape [B]=({batch},), got {tuple(n_new.shape)}")
        if batch and (n_new.dtype.is_floating_point or n_new.dtype.is_complex or str(n_new.dtype) == "torch.bool"):
            raise TypeError(f"n_new must hold integers, got dtype {n_new.dtype}")
        values = [int(x) for x in n_new.tolist()]
    else:
        arr = np.asarray(n_new)
        if arr.shape != (batch,):
            raise ValueError(f"n_new must have shape [B]=({batch},), got {arr.shape}")
        if batch and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"n_new must hold integers, got dtype {arr.dtype}")
        values = [int(x) for x in arr.tolist()]
    for b, n in enumerate(values):
        if not 0 <= n <= limit:
            raise ValueError(f"n_new[{b}]={n} is outside 0..T={limit}")
    return values


def _check_shapes(q_shape, k_shape) -> tuple[int, int]:
    """``(Hq, G)`` after checking ``q`` ``[B, Hq, T, d]`` against the cache's ``[B, Hkv, max_len, d]``."""
    B, Hkv, _, d = k_shape
    if len(q_shape) != 4 or q_shape[0] != B or q_shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q_shape)}")
    Hq = q_shape[1]
    if Hq == 0 or Hq % Hkv:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={Hkv}")
    return Hq, Hq // Hkv


@dataclass(frozen=True)
class Chunk:
    """One block of query slots ``[t0, t1)``: the keys it reads, ``[0, keys)``, and whether it needs a mask.

    ``masked`` is False when every real query of the chunk sees all ``keys``
    keys (a decode step with equal rows): the scores are then used as they come.
    """

    t0: int
    t1: int
    keys: int
    masked: bool


def plan(lens: list[int], n_new: list[int], T: int, slot_bytes: int, budget: int) -> list[Chunk]:
    """Cut the ``T`` query slots into chunks whose scores (``slot_bytes`` per slot) fit ``budget``.

    ``lens`` are the lengths after the append. A chunk where no row has a real
    query is skipped (its outputs are zeros), and so is every later one.
    """
    start = [length - n for length, n in zip(lens, n_new)]  # absolute position of slot 0
    width = max(1, min(T, budget // max(1, slot_bytes)))
    chunks = []
    for t0 in range(0, T, width):
        t1 = min(T, t0 + width)
        rows = [b for b, n in enumerate(n_new) if n > t0]
        if not rows:
            break
        keys = max(start[b] + min(t1, n_new[b]) for b in rows)
        masked = any(start[b] + t0 < keys - 1 for b in rows)
        chunks.append(Chunk(t0, t1, keys, masked))
    return chunks


def _visible(np_or_torch, lens, n_new, t0: int, t1: int, keys: int, **kw):
    """Boolean ``[B, t1 - t0, keys]``: key ``s`` visible to slot ``t`` of row ``b``; padded slots see every key."""
    xp = np_or_torch
    make = xp.asarray if xp is np else xp.tensor
    start = make([length - n for length, n in zip(lens, n_new)], **kw)
    counts = make(n_new, **kw)
    slots = xp.arange(t0, t1, **kw)
    pos = start[:, None] + slots[None, :]
    padded = slots[None, :] >= counts[:, None]
    return (xp.arange(keys, **kw)[None, None, :] <= pos[:, :, None]) | padded[:, :, None]


def tuned_numpy(q, cache, n_new, *, workspace_bytes: int = WORKSPACE_BYTES) -> np.ndarray:
    """GQA of the tokens just appended, NumPy, tuned for speed (see the module docstring).

    Args:
        q: ``[B, Hq, T, d]``, ``Hq = G * Hkv``.
        cache: ``k``, ``v`` ``[B, Hkv, max_len, d]`` arrays and ``lens`` int ``[B]`` (after the append).
        n_new: int ``[B]``, ``0 <= n_new[b] <= min(T, lens[b])``.
        workspace_bytes: the largest scores buffer kept between calls, and the
            budget that sets the query chunk.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype; padded slots exactly 0.

    Raises:
        ValueError, TypeError: as the reading copy (shapes, counts, more new
        tokens than a row holds), naming the argument.
    """
    q = np.asarray(q)
    k_all, v_all = cache.k, cache.v
    B, Hkv, _, d = k_all.shape
    Hq, G = _check_shapes(q.shape, k_all.shape)
    T = q.shape[2]
    n = _counts(n_new, B, T)
    lens = [int(x) for x in np.asarray(cache.lens).tolist()]
    for b in range(B):
        if n[b] > lens[b]:
            raise ValueError(f"n_new[{b}]={n[b]} but row {b} holds only lens[{b}]={lens[b]} tokens")
    S = max(lens, default=0)
    if T == 0 or S == 0 or max(n, default=0) == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    ct = np.result_type(q.dtype, k_all.dtype)
    if not np.issubdtype(ct, np.floating):
        ct = np.dtype(np.float64)
    item = ct.itemsize
    k, v = k_all[:, :, :S], v_all[:, :, :S]  # views: no copy when the cache is already in ct
    if k.dtype != ct:
        k, v = k.astype(ct), v.astype(ct)
    BH = B * Hkv
    # Scale the small q, not the scores; [B, Hkv, G, T, d]: row (g, t) of KV head j is query head j*G + g.
    qg = np.multiply(q, 1.0 / math.sqrt(d), dtype=ct).reshape(B, Hkv, G, T, d)
    chunks = plan(lens, n, T, 2 * BH * G * S * item, workspace_bytes)  # two buffers: K @ q^T and its transpose
    single = len(chunks) == 1 and chunks[0].t1 == T
    out = None if single else np.zeros((B, Hkv, G, T, d), dtype=ct)
    for c in chunks:
        tc, keys = c.t1 - c.t0, c.keys
        rows = G * tc
        size = BH * rows * keys
        ws = _workspace(("numpy", ct.str), 2 * size, 2 * size * item, workspace_bytes,
                        lambda m: np.empty(m, dtype=ct))
        qc = qg if tc == T else qg[:, :, :, c.t0:c.t1]
        qt = qc.reshape(BH, rows, d).swapaxes(1, 2)  # [BH, d, G*tc]
        kc = k[:, :, :keys].reshape(BH, keys, d)  # a view: B's stride is Hkv times the head's
        vc = v[:, :, :keys].reshape(BH, keys, d)
        # K in storage order times q^T: OpenBLAS reads K faster so than with K as the transposed operand.
        scores_t = np.matmul(kc, qt, out=ws[:size].reshape(BH, keys, rows))
        scores = ws[size:].reshape(BH, rows, keys)
        np.copyto(scores, scores_t.swapaxes(1, 2))
        if c.masked:
            hidden = ~_visible(np, lens, n, c.t0, c.t1, keys)
            np.copyto(scores.reshape(B, Hkv, G, tc, keys), -np.inf, where=hidden[:, None, None])
        peak = scores.max(axis=-1, keepdims=True)
        np.subtract(scores, peak, out=scores)
        np.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        oc = np.matmul(scores, vc)  # [BH, G*tc, d], unnormalised
        oc /= total  # normalise the small output, not the [BH, G*tc, keys] weights
        if single:
            out = oc.reshape(B, Hkv, G, T, d)
        else:
            out[:, :, :, c.t0:c.t1] = oc.reshape(B, Hkv, G, tc, d)
    result = out.reshape(B, Hq, T, d)
    if min(n) < T:
        padded = np.arange(T)[None, :] >= np.asarray(n)[:, None]
        np.copyto(result, 0, where=padded[:, None, :, None])
    return result.astype(q.dtype, copy=False)


def tuned_torch(q, cache, n_new, *, workspace_bytes: int = WORKSPACE_BYTES):
    """GQA of the tokens just appended, PyTorch, tuned for speed (see the module docstring).

    Args:
        q: ``[B, Hq, T, d]`` tensor on the cache's device, ``Hq = G * Hkv``.
        cache: ``k``, ``v`` ``[B, Hkv, max_len, d]`` tensors and ``lens`` int64 ``[B]`` (after the append).
        n_new: int ``[B]`` (tensor or sequence), ``0 <= n_new[b] <= min(T, lens[b])``.
        workspace_bytes: the largest scores buffer kept between calls, and the
            budget that sets the query chunk.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype; padded slots exactly 0.

    Raises:
        ValueError, TypeError: as the reading copy, naming the argument.
    """
    import torch

    k_all, v_all = cache.k, cache.v
    B, Hkv, _, d = k_all.shape
    Hq, G = _check_shapes(tuple(q.shape), tuple(k_all.shape))
    T = q.shape[2]
    n = _counts(n_new, B, T)
    lens = [int(x) for x in cache.lens.tolist()]  # one read-back, as the reading copy's lens.max()
    for b in range(B):
        if n[b] > lens[b]:
            raise ValueError(f"n_new[{b}]={n[b]} but row {b} holds only lens[{b}]={lens[b]} tokens")
    S = max(lens, default=0)
    if T == 0 or S == 0 or max(n, default=0) == 0:
        return torch.zeros_like(q)

    dtype, device = k_all.dtype, k_all.device
    low = dtype in (torch.bfloat16, torch.float16)
    item = k_all.element_size()
    k, v = k_all[:, :, :S], v_all[:, :, :S]
    BH = B * Hkv
    qg = (q.to(dtype) * (1.0 / math.sqrt(d))).reshape(B, Hkv, G, T, d)  # scale q, not the scores
    chunks = plan(lens, n, T, BH * G * S * item, workspace_bytes)
    single = len(chunks) == 1 and chunks[0].t1 == T
    out = None if single else torch.zeros(B, Hkv, G, T, d, dtype=dtype, device=device)
    for c in chunks:
        tc, keys = c.t1 - c.t0, c.keys
        rows = G * tc
        size = BH * rows * keys
        ws = _workspace(("torch", str(device), dtype), size, size * item, workspace_bytes,
                        lambda m: torch.empty(m, dtype=dtype, device=device))
        qc = (qg if tc == T else qg[:, :, :, c.t0:c.t1]).reshape(BH, rows, d)
        kc = k[:, :, :keys].reshape(BH, keys, d)  # views of the cache
        vc = v[:, :, :keys].reshape(BH, keys, d)
        scores = torch.bmm(qc, kc.transpose(1, 2), out=ws.view(BH, rows, keys))  # q @ K^T, K not copied
        if c.masked:
            hidden = ~_visible(torch, lens, n, c.t0, c.t1, keys, device=device)
            scores.view(B, Hkv, G, tc, keys).masked_fill_(hidden[:, None, None], float("-inf"))
        if low:
            weights = torch.softmax(scores, -1, dtype=torch.float32).to(dtype)
        else:
            weights = torch.softmax(scores, -1, out=scores)  # in place: no second 4 MiB tensor
        oc = torch.bmm(weights, vc)  # [BH, G*tc, d], a fresh tensor (never the workspace)
        if single:
            out = oc.view(B, Hkv, G, T, d)
        else:
            out[:, :, :, c.t0:c.t1] = oc.view(B, Hkv, G, tc, d)
    result = out.view(B, Hq, T, d)
    if min(n) < T:
        padded = torch.arange(T, device=device)[None, :] >= torch.tensor(n, device=device)[:, None]
        result.masked_fill_(padded[:, None, :, None], 0.0)
    return result.to(q.dtype)
