"""Figure 5: the PyTorch port's decode step on a CUDA device, bf16, against the device's copy bandwidth.

Run as one short job (about a minute, most of it CUDA start-up and filling 1 GiB
of cache) on a machine with a CUDA device::

    python benchmarks/gpu_decode.py --json gpu.json

Shape: B = 32, Hkv = 8, G = 4, d = 128, live length 8,192 in a reservation of
8,192, bf16: the live K and V are ``2 * 32 * 8 * 8192 * 128 * 2`` B = 1 GiB, read
at least once per step. The cache is filled through the port's own ``append``
(a prefill of 8,191 tokens, then one decode token) and the step timed is
``gqa_attention`` of the decode token. Against, in the same run and the same
interleaved rounds:

- the device's copy bandwidth: ``dst.copy_(src)`` of a 2 GiB tensor, counted as
  read + write (``2 * nbytes / seconds``), the usual "achievable bandwidth";
- ``scaled_dot_product_attention(q, k, v, enable_gqa=True)`` on the same cache views;
- repeat-then-attend (``repeat_interleave`` of K and V by G, then SDPA).

Times are wall clock around each call with ``torch.cuda.synchronize()`` on both
sides, so the port's host-side work (its ``lens.max()`` read-back, validation)
counts, as it does in a server's decode loop; each figure is the fastest of the
rounds. With no CUDA device it says so and exits 0. ``--dry-run`` runs the same
code on the CPU at a toy size, to check the script without a GPU (its numbers
mean nothing).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FULL = dict(batch=32, kv_heads=8, group=4, head_dim=128, live=8192, max_len=8192, copy_bytes=2 * 2**30, rounds=20)
DRY = dict(batch=2, kv_heads=2, group=4, head_dim=16, live=64, max_len=64, copy_bytes=2**20, rounds=3)


def _timed(fn, sync) -> float:
    """Seconds of one call of ``fn``, device synchronised before and after."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def measure(device: str, dtype_name: str = "bfloat16", size: dict = FULL, seed: int = 0) -> dict:
    """Run figure 5 on ``device``; returns seconds, bytes per second and the ratios.

    Keys: ``gpu_copy_bw_bytes_per_s`` (read + write bytes of the copy over its
    seconds), ``gpu_decode_torch_seconds``/``_sdpa_``/``_repeat_``,
    ``gpu_decode_torch_bytes_per_s`` (live K/V bytes over the port's seconds),
    ``gpu_decode_torch_fraction_of_copy_bw``, ``gpu_decode_torch_vs_sdpa`` (SDPA
    seconds over the port's), ``gpu_decode_repeat_vs_torch`` and the shape.
    """
    import torch
    import torch.nn.functional as F

    from solutions import kv_cache_torch as port

    dtype = getattr(torch, dtype_name)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    B, H, G, d = size["batch"], size["kv_heads"], size["group"], size["head_dim"]
    live, max_len = size["live"], size["max_len"]
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.inference_mode():
        cache = port.KVCache(B, H, max_len, d, dtype=dtype, device=device)
        k_pre = torch.randn(B, H, live - 1, d, generator=gen, device=device, dtype=dtype)
        cache.append(k_pre, k_pre.neg(), torch.full((B,), live - 1, dtype=torch.int64))
        del k_pre
        k1 = torch.randn(B, H, 1, d, generator=gen, device=device, dtype=dtype)
        ones = torch.ones(B, dtype=torch.int64, device=device)
        cache.append(k1, k1.neg(), ones)
        q = torch.randn(B, G * H, 1, d, generator=gen, device=device, dtype=dtype)
        k, v = cache.k[:, :, :live], cache.v[:, :, :live]
        src = torch.empty(size["copy_bytes"] // 2, dtype=torch.bfloat16, device=device).fill_(1)
        dst = torch.empty_like(src)
        variants = {
            "copy": lambda: dst.copy_(src),
            "torch": lambda: port.gqa_attention(q, cache, ones),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            "repeat": lambda: F.scaled_dot_product_attention(
                q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)),
        }
        outs = {name: variants[name]().float() for name in ("torch", "sdpa", "repeat")}
        max_diff = max(float((outs[n] - outs["torch"]).abs().max()) for n in ("sdpa", "repeat"))
        del outs
        best = {name: math.inf for name in variants}
        for _ in range(2):  # warm-up rounds
            for fn in variants.values():
                _timed(fn, sync)
        for _ in range(size["rounds"]):
            for name, fn in variants.items():
                best[name] = min(best[name], _timed(fn, sync))
    live_bytes = 2 * B * H * live * d * torch.finfo(dtype).bits // 8
    copy_bw = 2 * size["copy_bytes"] / best["copy"]
    return {
        "gpu_device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "gpu_dtype": dtype_name,
        "gpu_shape": {k: size[k] for k in ("batch", "kv_heads", "group", "head_dim", "live", "max_len")},
        "gpu_live_kv_bytes": live_bytes,
        "gpu_copy_bytes": size["copy_bytes"],
        "gpu_copy_bw_bytes_per_s": copy_bw,
        "gpu_decode_torch_seconds": best["torch"],
        "gpu_decode_sdpa_seconds": best["sdpa"],
        "gpu_decode_repeat_seconds": best["repeat"],
        "gpu_decode_torch_bytes_per_s": live_bytes / best["torch"],
        "gpu_decode_torch_fraction_of_copy_bw": live_bytes / best["torch"] / copy_bw,
        "gpu_decode_sdpa_fraction_of_copy_bw": live_bytes / best["sdpa"] / copy_bw,
        "gpu_decode_torch_vs_sdpa": best["sdpa"] / best["torch"],
        "gpu_decode_repeat_vs_torch": best["repeat"] / best["torch"],
        "gpu_outputs_max_abs_diff": max_diff,
        "gpu_rounds": size["rounds"],
        "torch_version": torch.__version__,
    }


def cuda_available() -> bool:
    """Whether torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def report(r: dict) -> str:
    """The figures as text lines (ms, GB/s)."""
    return "\n".join([
        f"device: {r['gpu_device']}, {r['gpu_dtype']}, shape {r['gpu_shape']}",
        f"copy bandwidth (read + write): {r['gpu_copy_bw_bytes_per_s'] / 1e9:,.0f} GB/s",
        f"port decode step: {r['gpu_decode_torch_seconds'] * 1e3:.3f} ms, "
        f"{r['gpu_decode_torch_bytes_per_s'] / 1e9:,.0f} GB/s of live K/V = "
        f"{r['gpu_decode_torch_fraction_of_copy_bw']:.0%} of the copy bandwidth",
        f"SDPA enable_gqa: {r['gpu_decode_sdpa_seconds'] * 1e3:.3f} ms "
        f"({r['gpu_decode_sdpa_fraction_of_copy_bw']:.0%}); port vs SDPA {r['gpu_decode_torch_vs_sdpa']:.2f}x",
        f"repeat-then-attend: {r['gpu_decode_repeat_seconds'] * 1e3:.3f} ms "
        f"({r['gpu_decode_repeat_vs_torch']:.1f}x the port)",
        f"outputs agree to {r['gpu_outputs_max_abs_diff']:.2e} (max abs diff, bf16)",
    ])


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/gpu_decode.py [--json FILE] [--dry-run]``: exit 0, also when there is no CUDA."""
    p = argparse.ArgumentParser(description="The port's bf16 decode on a CUDA device against its copy bandwidth.")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--dry-run", action="store_true", help="run on the CPU at a toy size (checks the script only)")
    args = p.parse_args(argv)
    if args.dry_run:
        result = measure("cpu", size=DRY)
        result["gpu_dry_run"] = True
    elif not cuda_available():
        print("gpu_decode: no CUDA device here: nothing measured (run this on a machine with one)")
        if args.json:
            Path(args.json).write_text(json.dumps({"cuda": False, "reason": "no CUDA device"}, indent=2) + "\n")
        return 0
    else:
        result = measure("cuda")
    result["cuda"] = not args.dry_run
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
