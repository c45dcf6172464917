"""The bench's pictures (matplotlib, Agg backend: no display needed).

``concat.png``: figure 1, time to generate n tokens (left) and bytes copied,
measured against the cost model's formula (right). ``decode.png``: figure 2,
bytes per second of live K/V each decode variant achieved, against the read
bandwidth measured in the same run.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_concat(fig1: dict, path: Path) -> Path:
    """Write figure 1 to ``path`` (PNG) from ``concat_figures``' result (its ``series``)."""
    s = fig1["series"]
    n = s["n"]
    model = fig1["concat_model"]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    ax_t.plot(n, [t * 1e3 for t in s["concat_seconds"]], label=f"concatenating (slope {fig1['concat_exponent']:.2f})")
    ax_t.plot(n, [t * 1e3 for t in s["prealloc_seconds"]], label=f"preallocated (slope {fig1['prealloc_exponent']:.2f})")
    ax_t.set_xlabel("tokens generated, n")
    ax_t.set_ylabel("cumulative cache time, ms (fastest of rounds)")
    ax_t.set_title(f"time: {fig1['concat_time_ratio']:.0f}x at n = {n[-1]:,}")
    ax_t.legend(title="log-log slope, upper 3/4 of n")
    ax_t.grid(alpha=0.3)

    gib = 2**30
    step = max(1, len(n) // 48)
    ax_b.plot(n, [b / gib for b in s["bytes_formula"]], color="black", lw=1,
              label="formula: cost.concat_bytes_copied(n)")
    ax_b.plot(n[::step], [b / gib for b in s["bytes_measured"][::step]], "o", ms=3.5, color="C0",
              label="concatenating, measured (tracemalloc)")
    ax_b.plot([n[0], n[-1]], [0, 0], color="C1", label="preallocated: 0 B copied")
    ax_b.set_xlabel("tokens generated, n")
    ax_b.set_ylabel("bytes of existing tokens copied, GiB")
    ax_b.set_title(f"bytes copied: measured / formula = {fig1['concat_bytes_ratio']:.5f}")
    ax_b.legend()
    ax_b.grid(alpha=0.3)
    fig.suptitle(f"Growing a KV cache by concatenation vs writing into a preallocated one "
                 f"({model['layers']} layers, {model['kv_heads']} KV heads, head_dim {model['head_dim']}, "
                 f"{model['dtype']}: {fig1['concat_bytes_per_token']:,} B per token)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_decode(fig2: dict, path: Path) -> Path:
    """Write figure 2 to ``path`` (PNG): achieved GB/s of each decode variant and the read bandwidth."""
    names = [("numpy", "NumPy reference"), ("numpy_1thread", "NumPy reference, 1 thread"),
             ("torch", "PyTorch port"), ("torch_1thread", "PyTorch port, 1 thread"),
             ("tuned_numpy", "tuned NumPy"), ("tuned_torch", "tuned PyTorch"),
             ("sdpa", "SDPA enable_gqa=True"), ("repeat", "repeat_interleave + SDPA")]
    names = [(k, label) for k, label in names if f"decode_{k}_bytes_per_s" in fig2]
    gbs = [fig2[f"decode_{k}_bytes_per_s"] / 1e9 for k, _ in names]
    bw = fig2["read_bw_bytes_per_s"] / 1e9
    shape = fig2["decode_shape"]
    fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(names) + 1.6), constrained_layout=True)
    colors = {"numpy": "C0", "numpy_1thread": "#9ecae1", "torch": "C1", "torch_1thread": "#fdae6b",
              "sdpa": "C2", "repeat": "C3", "tuned_numpy": "C4", "tuned_torch": "C5"}
    bars = ax.barh([label for _, label in names][::-1], gbs[::-1], color=[colors[k] for k, _ in names][::-1])
    ax.set_ylim(-0.5, len(names) - 0.1)
    for bar, value in zip(bars, gbs[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.1f} GB/s ({value / bw:.0%})",
                va="center", fontsize=9)
    ax.axvline(bw, color="black", lw=1.2)
    ax.text(bw, -0.45, f"read bandwidth {bw:.1f} GB/s ", ha="right", va="bottom", fontsize=9)
    for fraction, label in ((0.50, "tuned target 50%"), (0.40, "port target 40%"), (0.25, "NumPy target 25%")):
        ax.axvline(bw * fraction, color="grey", lw=0.8, ls="--")
        ax.text(bw * fraction, len(names) - 0.15, f"{label} ", fontsize=7.5, color="grey", va="top", ha="right",
                rotation=90)
    ax.set_xlim(0, max(bw, max(gbs)) * 1.3)
    ax.set_xlabel("live K/V bytes read per second of a decode step, GB/s")
    ax.set_title(f"Decode step: B={shape['batch']}, Hkv={shape['kv_heads']}, G={shape['group']}, "
                 f"d={shape['head_dim']}, live {shape['live']:,} of {shape['max_len']:,}, float32 "
                 f"({fig2['decode_live_kv_bytes'] / 2**20:.0f} MiB live)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
