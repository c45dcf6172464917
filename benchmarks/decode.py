"""Figures 2 and 3: a decode step against the physical limit, and live length against reservation.

Figure 2. One decode step at ``DecodeShape()`` (B = 8, Hkv = 8, G = 4, d = 128,
live length 4,096 in a reservation of 8,192, float32): the caches are filled
through the kit's own API (a prefill ``append`` of 4,095 tokens, then a decode
``append`` of one), and what is timed is the attention of the one new query per
row over the 4,096 live keys (``gqa_attention``; the append is timed apart). Its
floor is reading the live K and V once: ``2 * B * Hkv * live * d * 4`` B =
268,435,456 B. Achieved bytes per second (those bytes over the step's seconds) are
set against the read bandwidth of this machine measured in the same run: the
fastest of ``ndarray.sum`` (one thread) and ``torch.sum`` (all of torch's threads)
over an array far larger than the last-level cache. Compared in the same rounds:

- ``scaled_dot_product_attention(q, k, v, enable_gqa=True)`` on the port's cache
  views (no mask: every row has the same length and the query is the last
  position, so it sees every live key);
- repeat-then-attend: ``k.repeat_interleave(G, dim=1)`` (and v), then SDPA
  without ``enable_gqa``: the ``kv_repeat`` mistake, G times the KV written and
  read per step;
- the NumPy reference and the port again with one thread each (OpenBLAS and
  torch's OpenMP; set through ``benchmarks/threads.py`` around those calls only),
  to show what the default thread count costs or gains on this machine;
- the tuned copies of both (``benchmarks/tuned.py``: ``tuned_numpy`` on the NumPy
  cache, ``tuned_torch`` on the port's), each right after its family's read pass,
  so that it never follows a step that has just read the same K/V.

Figure 3. The same live length (``RESERVATION_LIVE`` = 448 tokens) in a
reservation of 8,192 and of 512: the time of a decode step in the large one over
the small one, for both implementations. A step that scans ``max_len`` keys
instead of ``lens.max()`` would cost 18 times more in the large one. The batch
is 32 rows (``RESERVATION_BATCH``), so that the live K/V (117 MB) is well past
the 32 MiB last-level cache in both: at 8 rows it is 29 MB, about the cache's
size, and whether it stays in the cache (shared with the neighbours) depends on
where each buffer's pages land, which swung the ratio between 0.9 and 5 from run
to run.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.opprofile import profile_numpy, profile_torch
from benchmarks.threads import openblas_threads, setter
from benchmarks.timing import interleaved
from benchmarks.tuned import tuned_numpy, tuned_torch
from solutions import kv_cache as ref
from solutions import kv_cache_torch as port

SETTLE_SECONDS = 0.15


def settle() -> None:
    """Pause ``SETTLE_SECONDS`` so that OpenBLAS's (or OpenMP's) idle threads stop spinning
    before the other runtime's variant starts (they spin on for a while after a call)."""
    time.sleep(SETTLE_SECONDS)


RESERVATION_LIVE = 448
RESERVATION_BATCH = 32
RESERVATIONS = (512, 8192)


@dataclass(frozen=True)
class DecodeShape:
    """Shape of the decode figure. ``live``: keys per row after the append; ``max_len``: reservation."""

    batch: int = 8
    kv_heads: int = 8
    group: int = 4
    head_dim: int = 128
    live: int = 4096
    max_len: int = 8192

    @property
    def q_heads(self) -> int:
        """``Hq = G * Hkv``."""
        return self.group * self.kv_heads

    @property
    def live_kv_bytes(self) -> int:
        """Bytes of live K and V a step must read at least once (float32): ``2 * B * Hkv * live * d * 4``."""
        return 2 * self.batch * self.kv_heads * self.live * self.head_dim * 4


@dataclass
class DecodeSetup:
    """The two caches of one ``DecodeShape``, holding the same K/V, and one step's inputs.

    Attributes:
        np_cache, torch_cache: ``solutions.kv_cache.KVCache`` / ``solutions.kv_cache_torch.KVCache``
            with ``lens == live`` in every row, the last token appended alone.
        q_np, q_torch: ``[B, Hq, 1, d]`` float32 queries of the decode token.
        ones_np, ones_torch: int64 ``[B]`` of 1 (``n_new`` of the decode step).
        decode_token: ``(k, v)``, each ``[B, Hkv, 1, d]`` float32 torch (shared with NumPy).
    """

    shape: DecodeShape
    np_cache: ref.KVCache
    torch_cache: port.KVCache
    q_np: np.ndarray
    q_torch: torch.Tensor
    ones_np: np.ndarray
    ones_torch: torch.Tensor
    decode_token: tuple


def build(shape: DecodeShape, seed: int = 0) -> DecodeSetup:
    """Fill both caches through ``append``: ``live - 1`` tokens as one prefill, then one decode token."""
    gen = torch.Generator().manual_seed(seed)
    B, H, d = shape.batch, shape.kv_heads, shape.head_dim
    np_cache = ref.KVCache(B, H, shape.max_len, d, dtype=np.float32)
    torch_cache = port.KVCache(B, H, shape.max_len, d, dtype=torch.float32)
    prefill = shape.live - 1
    k_pre = torch.randn(B, H, prefill, d, generator=gen)
    v_pre = torch.randn(B, H, prefill, d, generator=gen)
    counts = np.full(B, prefill, dtype=np.int64)
    np_cache.append(k_pre.numpy(), v_pre.numpy(), counts)
    torch_cache.append(k_pre, v_pre, torch.from_numpy(counts))
    del k_pre, v_pre
    k1, v1 = torch.randn(B, H, 1, d, generator=gen), torch.randn(B, H, 1, d, generator=gen)
    ones_np = np.ones(B, dtype=np.int64)
    ones_torch = torch.ones(B, dtype=torch.int64)
    np_cache.append(k1.numpy(), v1.numpy(), ones_np)
    torch_cache.append(k1, v1, ones_torch)
    q = torch.randn(B, shape.q_heads, 1, d, generator=gen)
    return DecodeSetup(shape, np_cache, torch_cache, q.numpy(), q, ones_np, ones_torch, (k1, v1))


def live_views(s: DecodeSetup) -> tuple[torch.Tensor, torch.Tensor]:
    """The port's live K and V: ``[B, Hkv, live, d]`` views of its buffers (no copy)."""
    live = s.shape.live
    return s.torch_cache.k[:, :, :live], s.torch_cache.v[:, :, :live]


def step_variants(s: DecodeSetup) -> dict:
    """The decode-step attentions of figure 2 (reading copies, tuned copies, SDPA, repeat), as zero-argument callables."""
    k, v = live_views(s)
    G = s.shape.group
    return {
        "numpy": lambda: ref.gqa_attention(s.q_np, s.np_cache, s.ones_np),
        "torch": lambda: port.gqa_attention(s.q_torch, s.torch_cache, s.ones_torch),
        "tuned_numpy": lambda: tuned_numpy(s.q_np, s.np_cache, s.ones_np),
        "tuned_torch": lambda: tuned_torch(s.q_torch, s.torch_cache, s.ones_torch),
        "sdpa": lambda: F.scaled_dot_product_attention(s.q_torch, k, v, enable_gqa=True),
        "repeat": lambda: F.scaled_dot_product_attention(
            s.q_torch, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)),
    }


def outputs_agree(s: DecodeSetup) -> float:
    """Largest absolute difference between the variants' outputs (float32; about 1e-6 expected)."""
    outs = [torch.as_tensor(np.asarray(f())) for f in step_variants(s).values()]
    return float(max((o - outs[0]).abs().max() for o in outs[1:]))


def read_buffer(nbytes: int) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` bytes (ones), first-touched, for the read-bandwidth passes."""
    return torch.ones(nbytes // 4, dtype=torch.float32)


def decode_figures(shape: DecodeShape, rounds: int, read_bytes: int, seed: int = 0,
                   profile_calls: int = 5, repeat_every: int = 3, budget_s: float | None = None) -> dict:
    """Figure 2: time the decode variants and the two read passes in ``rounds`` interleaved rounds.

    Args:
        shape: the decode shape (``DecodeShape()`` for the published figure).
        rounds: interleaved rounds; every figure is the fastest round.
        read_bytes: size of the array summed for the read bandwidth, bytes.
        profile_calls: calls profiled op by op (the fastest one is kept).
        repeat_every: repeat-then-attend (about 10x slower than the rest) runs
            only every this many rounds.
        budget_s: seconds after which no new round starts (at least 3 run).

    Returns a dict (seconds, bytes per second, fractions): ``read_bw_bytes_per_s``
    (the faster of the two read passes) and each pass's, ``decode_*_seconds``,
    ``decode_*_bytes_per_s`` (live K/V bytes over seconds), the four figures the
    issue names, the tuned copies' (``decode_tuned_torch_fraction_of_read_bw``,
    ``decode_tuned_torch_vs_sdpa``, ``decode_tuned_*_vs_*``: the reading copy's
    seconds over the tuned one's), the append's seconds, the op profiles and the
    thread counts.
    """
    with torch.inference_mode():
        s = build(shape, seed)
        big = read_buffer(read_bytes)
        big_np = big.numpy()
        steps = step_variants(s)
        k1, v1 = s.decode_token
        live = shape.live
        blas_default, torch_default = openblas_threads(), torch.get_num_threads()
        default = setter(blas_default, torch_default)
        # Each round runs the NumPy family, then the torch family, with a pause
        # between (``settle``): OpenBLAS's idle threads spin for a while after a
        # call and would take a core from the torch op right after (measured
        # here: the port 53 ms right after the NumPy step, 29 ms after a pause).
        # The appends of the decode token are undone (lens back to live - 1)
        # before each call. The ``*_1thread`` variants are the same steps with one
        # thread (OpenBLAS for NumPy, OpenMP for torch): what the default thread
        # count costs or gains on a small shared machine. The tuned copies run
        # right after the read passes (K/V not just read by another step).
        variants = {
            "read_numpy": lambda: big_np.sum(),
            "tuned_numpy": steps["tuned_numpy"],
            "numpy": steps["numpy"],
            "append_numpy": lambda: s.np_cache.append(k1.numpy(), v1.numpy(), s.ones_np),
            "numpy_1thread": steps["numpy"],
            "read_torch": lambda: big.sum(),
            "tuned_torch": steps["tuned_torch"],
            "torch": steps["torch"],
            "sdpa": steps["sdpa"],
            "repeat": steps["repeat"],
            "append_torch": lambda: s.torch_cache.append(k1, v1, s.ones_torch),
            "torch_1thread": steps["torch"],
        }
        setup = {name: default for name in variants}
        setup["read_numpy"] = lambda: (default(), settle())
        setup["append_numpy"] = lambda: (default(), s.np_cache.lens.fill(live - 1))
        setup["numpy_1thread"] = setter(1 if blas_default is not None else None, torch_default)
        setup["read_torch"] = lambda: (default(), settle())
        setup["append_torch"] = lambda: (default(), s.torch_cache.lens.fill_(live - 1))
        setup["torch_1thread"] = setter(blas_default, 1)
        agree = outputs_agree(s)
        try:
            t = interleaved(variants, rounds, setup=setup, every={"repeat": repeat_every}, budget_s=budget_s)
        finally:
            default()
        s.np_cache.lens.fill(live)
        s.torch_cache.lens.fill_(live)
        assert int(s.np_cache.lens.min()) == live and int(s.torch_cache.lens.min()) == live
        profiles = {"numpy": profile_numpy(variants["numpy"], s.np_cache, profile_calls)}
        settle()
        profiles["torch"] = profile_torch(variants["torch"], profile_calls)
        settle()
        profiles["tuned_numpy"] = profile_numpy(variants["tuned_numpy"], s.np_cache, profile_calls)
        settle()
        profiles["tuned_torch"] = profile_torch(variants["tuned_torch"], profile_calls)
        del big, big_np, s

    read_np = read_bytes / t["read_numpy"].best
    read_torch = read_bytes / t["read_torch"].best
    read_bw = max(read_np, read_torch)
    live_bytes = shape.live_kv_bytes
    out = {
        "decode_shape": asdict(shape),
        "decode_live_kv_bytes": live_bytes,
        "read_bytes": read_bytes,
        "read_bw_bytes_per_s": read_bw,
        "read_bw_numpy_sum_bytes_per_s": read_np,
        "read_bw_torch_sum_bytes_per_s": read_torch,
        "torch_num_threads": torch_default,
        "openblas_num_threads": blas_default,
        "decode_outputs_max_abs_diff": agree,
        "decode_rounds": len(t["numpy"].samples),
    }
    for name in ("numpy", "torch", "sdpa", "repeat", "numpy_1thread", "torch_1thread", "tuned_numpy", "tuned_torch"):
        out[f"decode_{name}_seconds"] = t[name].best
        out[f"decode_{name}_median_seconds"] = t[name].median
        out[f"decode_{name}_bytes_per_s"] = live_bytes / t[name].best
        out[f"decode_{name}_fraction_of_read_bw"] = live_bytes / t[name].best / read_bw
    # A check on the minima: the same fractions taken round by round (each decode
    # step against the faster read pass of its own round), then the median.
    for name in ("numpy", "torch", "sdpa", "tuned_numpy", "tuned_torch"):
        per_round = [live_bytes / step / (read_bytes / min(a, b))
                     for step, a, b in zip(t[name].samples, t["read_numpy"].samples, t["read_torch"].samples)]
        out[f"decode_{name}_fraction_of_read_bw_round_median"] = float(np.median(per_round))
    out["decode_torch_vs_sdpa"] = t["sdpa"].best / t["torch"].best
    out["decode_repeat_vs_torch"] = t["repeat"].best / t["torch"].best
    out["decode_numpy_vs_torch"] = t["numpy"].best / t["torch"].best
    # The tuned copies: against SDPA, and how many times faster than the reading copies.
    out["decode_tuned_torch_vs_sdpa"] = t["sdpa"].best / t["tuned_torch"].best
    out["decode_tuned_torch_vs_torch"] = t["torch"].best / t["tuned_torch"].best
    out["decode_tuned_numpy_vs_numpy"] = t["numpy"].best / t["tuned_numpy"].best
    out["append_numpy_seconds"] = t["append_numpy"].best
    out["append_torch_seconds"] = t["append_torch"].best
    out["decode_profile"] = {name: [[op, sec, shapes] for op, sec, shapes in ops] for name, ops in profiles.items()}
    return out


def reservation_figures(rounds: int, seed: int = 0, live: int = RESERVATION_LIVE, batch: int = RESERVATION_BATCH,
                        reservations: tuple[int, int] = RESERVATIONS) -> dict:
    """Figure 3: a decode step at the same ``live`` length in a small and a large reservation.

    Both reservations are filled through ``append`` with the same K/V; the four
    steps (NumPy and PyTorch, small and large) run interleaved. Returns seconds per
    step for each, ``reservation_time_ratio_numpy``/``_torch`` (large over small)
    and ``reservation_time_ratio``, the larger of the two.
    """
    small, large = reservations
    base = DecodeShape(batch=batch, live=live)
    with torch.inference_mode():
        setups = {m: build(DecodeShape(batch=batch, live=live, max_len=m), seed) for m in (small, large)}
        steps = {m: step_variants(s) for m, s in setups.items()}
        # NumPy pair, pause, torch pair (see ``settle``); each pair compared within itself.
        variants = {f"numpy_{m}": steps[m]["numpy"] for m in setups}
        variants.update({f"torch_{m}": steps[m]["torch"] for m in setups})
        t = interleaved(variants, rounds, setup={f"numpy_{small}": settle, f"torch_{small}": settle})
        del setups
    out = {"reservation_live": live, "reservation_small": small, "reservation_large": large,
           "reservation_shape": asdict(base)}
    for impl in ("numpy", "torch"):
        out[f"reservation_{impl}_small_seconds"] = t[f"{impl}_{small}"].best
        out[f"reservation_{impl}_large_seconds"] = t[f"{impl}_{large}"].best
        out[f"reservation_time_ratio_{impl}"] = t[f"{impl}_{large}"].best / t[f"{impl}_{small}"].best
    out["reservation_time_ratio"] = max(out["reservation_time_ratio_numpy"], out["reservation_time_ratio_torch"])
    return out

