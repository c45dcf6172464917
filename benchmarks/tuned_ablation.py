"""What each trick of ``benchmarks/tuned.py`` buys on the decode figure: one trick undone at a time.

    python -m benchmarks.tuned_ablation [--rounds 20] [--json FILE]

The decode shape of ``kvkit bench`` (``benchmarks.decode.DecodeShape``: B = 8,
Hkv = 8, G = 4, d = 128, T = 1, 4,096 live keys of 8,192, float32), the caches
filled through the reading copy's ``append``. Every variant runs interleaved
with the others (``benchmarks.timing.interleaved``), the NumPy family and the
torch family separated by a pause (OpenBLAS's idle threads spin after a call);
each keeps its fastest round, and what is printed is each variant's time over
the tuned step's in the same run. The variants are the decode core of
``tuned.py`` with one switch flipped (no validation or chunk plan: those are
timed apart as ``tuned`` against ``core``):

- ``kq``: ``K @ qᵀ`` instead of ``q @ Kᵀ`` (torch) / ``qkT``: ``q @ Kᵀ`` instead of ``K @ qᵀ`` (NumPy);
- ``bcast``: the reading copy's group-broadcast ``q[:, :, :, None] @ Kᵀ`` (NumPy);
- ``fresh``: new scores/weights tensors every call instead of the kept buffer;
- ``masked``: the mask built from ``lens`` and applied although it hides nothing;
- ``scale_scores``: the scale applied to the scores instead of q;
- ``norm_weights``: the weights normalised instead of the output (NumPy);
- ``1thread``: torch with one OpenMP thread; ``inference``: in ``torch.inference_mode``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.decode import DecodeShape, build, live_views, settle
from benchmarks.threads import setter
from benchmarks.timing import interleaved
from benchmarks.tuned import tuned_numpy, tuned_torch
from solutions import kv_cache as ref
from solutions import kv_cache_torch as port


def torch_core(q, k, v, *, kq=False, fresh=False, masked=False, scale_scores=False, lens=None, buf=None):
    """The tuned torch decode step, equal rows, ``T = 1``, with one trick switched off at a time."""
    B, Hkv, S, d = k.shape
    G = q.shape[1] // Hkv
    BH, scale = B * Hkv, 1.0 / math.sqrt(d)
    qf = (q if scale_scores else q * scale).reshape(BH, G, d)
    k3, v3 = k.reshape(BH, S, d), v.reshape(BH, S, d)
    if kq:
        scores = torch.bmm(k3, qf.transpose(1, 2)).transpose(1, 2)
    elif fresh:
        scores = torch.bmm(qf, k3.transpose(1, 2))
    else:
        scores = torch.bmm(qf, k3.transpose(1, 2), out=buf[: BH * G * S].view(BH, G, S))
    if scale_scores:
        scores = scores.mul_(scale)
    if masked:
        hidden = torch.arange(S)[None, :] >= lens[:, None]  # [B, S]
        scores.view(B, Hkv, G, S).masked_fill_(hidden[:, None, None], float("-inf"))
    if fresh or kq:
        weights = torch.softmax(scores, -1)
    else:
        weights = torch.softmax(scores, -1, out=scores)
    return torch.bmm(weights, v3).view(B, Hkv * G, 1, d)


def numpy_core(q, k, v, *, orient="kq", fresh=False, masked=False, norm_weights=False, lens=None, buf=None):
    """The tuned NumPy decode step, equal rows, ``T = 1``, with one trick switched off at a time."""
    B, Hkv, S, d = k.shape
    G = q.shape[1] // Hkv
    BH = B * Hkv
    qs = np.multiply(q, 1.0 / math.sqrt(d), dtype=k.dtype)
    k3, v3 = k.reshape(BH, S, d), v.reshape(BH, S, d)
    size = BH * G * S
    if orient == "kq":
        scores_t = np.matmul(k3, qs.reshape(BH, G, d).swapaxes(1, 2),
                             out=None if fresh else buf[:size].reshape(BH, S, G))
        if fresh:
            scores = np.ascontiguousarray(scores_t.swapaxes(1, 2))
        else:
            scores = buf[size:2 * size].reshape(BH, G, S)
            np.copyto(scores, scores_t.swapaxes(1, 2))
    elif orient == "qkT":
        scores = np.matmul(qs.reshape(BH, G, d), k3.swapaxes(1, 2), out=None if fresh else buf[:size].reshape(BH, G, S))
    else:  # the reading copy's broadcast over the group axis
        scores = (qs.reshape(B, Hkv, G, 1, d) @ k[:, :, None].swapaxes(-1, -2)).reshape(BH, G, S)
    if masked:
        hidden = np.arange(S)[None, :] >= np.asarray(lens)[:, None]
        np.copyto(scores.reshape(B, Hkv, G, S), -np.inf, where=hidden[:, None, None])
    np.subtract(scores, scores.max(axis=-1, keepdims=True), out=scores)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if norm_weights:
        scores /= total
        out = np.matmul(scores, v3)
    else:
        out = np.matmul(scores, v3)
        out /= total
    return out.reshape(B, Hkv * G, 1, d)


def measure(rounds: int = 20, read_bytes: int = 512 * 2**20, seed: int = 0) -> dict:
    """Time every variant in ``rounds`` interleaved rounds; seconds (fastest round) and ratios to ``tuned``."""
    shape = DecodeShape()
    s = build(shape, seed)
    k, v = live_views(s)
    kn, vn = s.np_cache.k[:, :, :shape.live], s.np_cache.v[:, :, :shape.live]
    G = shape.group
    lens_t, lens_n = s.torch_cache.lens, s.np_cache.lens
    tbuf = torch.empty(2 * shape.batch * shape.q_heads * shape.live)
    nbuf = np.empty(2 * shape.batch * shape.q_heads * shape.live, dtype=np.float32)
    big = torch.ones(read_bytes // 4)
    q, qn = s.q_torch, s.q_np

    def inference():
        with torch.inference_mode():
            return tuned_torch(q, s.torch_cache, s.ones_torch)

    numpy_family = {
        "numpy.reading_copy": lambda: ref.gqa_attention(qn, s.np_cache, s.ones_np),
        "numpy.tuned": lambda: tuned_numpy(qn, s.np_cache, s.ones_np),
        "numpy.core": lambda: numpy_core(qn, kn, vn, buf=nbuf),
        "numpy.qkT": lambda: numpy_core(qn, kn, vn, orient="qkT", buf=nbuf),
        "numpy.bcast": lambda: numpy_core(qn, kn, vn, orient="bcast", buf=nbuf),
        "numpy.fresh": lambda: numpy_core(qn, kn, vn, fresh=True),
        "numpy.masked": lambda: numpy_core(qn, kn, vn, masked=True, lens=lens_n, buf=nbuf),
        "numpy.norm_weights": lambda: numpy_core(qn, kn, vn, norm_weights=True, buf=nbuf),
    }
    torch_family = {
        "torch.read_sum": lambda: big.sum(),
        "torch.reading_copy": lambda: port.gqa_attention(q, s.torch_cache, s.ones_torch),
        "torch.sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "torch.tuned": lambda: tuned_torch(q, s.torch_cache, s.ones_torch),
        "torch.core": lambda: torch_core(q, k, v, buf=tbuf),
        "torch.kq": lambda: torch_core(q, k, v, kq=True),
        "torch.fresh": lambda: torch_core(q, k, v, fresh=True),
        "torch.masked": lambda: torch_core(q, k, v, masked=True, lens=lens_t, buf=tbuf),
        "torch.scale_scores": lambda: torch_core(q, k, v, scale_scores=True, buf=tbuf),
        "torch.inference": inference,
        "torch.1thread": lambda: tuned_torch(q, s.torch_cache, s.ones_torch),
    }
    expected = torch.as_tensor(np.asarray(ref.gqa_attention(qn, s.np_cache, s.ones_np)))
    agree = max(float((torch.as_tensor(np.asarray(f())) - expected).abs().max())
                for name, f in {**numpy_family, **torch_family}.items() if name != "torch.read_sum")
    default = setter(None, torch.get_num_threads())
    setup = {name: default for name in torch_family}
    setup["torch.read_sum"] = lambda: (default(), settle())
    setup["torch.1thread"] = setter(None, 1)
    setup["numpy.reading_copy"] = lambda: (default(), settle())
    try:
        t = interleaved({**numpy_family, **torch_family}, rounds, setup=setup)
    finally:
        default()
    out = {"shape": asdict(shape), "rounds": rounds,
           "max_abs_diff": agree, "read_bw_bytes_per_s": read_bytes / t["torch.read_sum"].best,
           "torch_num_threads": torch.get_num_threads(), "seconds": {}, "median_seconds": {}, "vs_tuned": {}}
    for name, timing in t.items():
        out["seconds"][name] = timing.best
        out["median_seconds"][name] = timing.median
        family = name.split(".")[0]
        out["vs_tuned"][name] = timing.best / t[f"{family}.tuned"].best
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    with torch.no_grad():
        r = measure(args.rounds)
    live_bytes = DecodeShape().live_kv_bytes
    print(f"read bandwidth (torch.sum, 512 MiB): {r['read_bw_bytes_per_s'] / 1e9:.1f} GB/s; "
          f"largest difference between variants {r['max_abs_diff']:.1e}")
    print(f"{'variant':22s} {'best ms':>8s} {'median':>8s} {'GB/s':>6s} {'/tuned':>7s}")
    for name, sec in r["seconds"].items():
        rate = "" if name == "torch.read_sum" else f"{live_bytes / sec / 1e9:6.1f}"
        print(f"{name:22s} {sec * 1e3:8.2f} {r['median_seconds'][name] * 1e3:8.2f} {rate:>6s} "
              f"{r['vs_tuned'][name]:7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
