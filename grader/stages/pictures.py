"""PNG pictures of a diagnosis, for the Markdown report (matplotlib, drawn off-screen).

A mask picture puts the keys a submission's queries saw beside the right
window for the smallest failing case; a head picture plots the KV head each
query head read against ``h // G``. The data comes from ``grader.stages.diagnose``
(recovered in the parent from outputs): nothing here runs submission code.
"""
from __future__ import annotations

import os

import numpy as np


def _mask_array(rows: list, width: int) -> np.ndarray:
    grid = np.zeros((max(len(rows), 1), max(width, 1)))
    for t, seen in enumerate(rows):
        for p in seen:
            if p < width:
                grid[t, p] = 1.0
    return grid


def save(picture: dict, kind: str, path: str) -> str:
    """Draw ``picture`` (a ``diagnose`` mask or heads picture) to the PNG ``path``; returns ``path``.

    Mask: two panels, ``[queries, keys]``, dark where a key is visible, the
    empty slots a query read written beside its row. Heads: query head on x,
    KV head on y, the submission's points over the right staircase.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if kind == "mask":
        width = picture["keys"]
        fig, axes = plt.subplots(1, 2, figsize=(2 + 0.45 * width * 2, 1.6 + 0.4 * len(picture["yours"])),
                                 squeeze=False)
        for ax, title, rows in ((axes[0][0], "yours", picture["yours"]), (axes[0][1], "right", picture["right"])):
            ax.imshow(_mask_array(rows, width), cmap="Greys", vmin=0, vmax=1.25, aspect="equal")
            ax.set_title(title)
            ax.set_xlabel("key position")
            ax.set_ylabel("query slot")
            ax.set_xticks(range(width))
            ax.set_yticks(range(len(rows)))
        for t, empty in enumerate(picture.get("empty") or []):
            if empty:
                axes[0][0].text(width - 0.4, t, f" +{empty} empty", va="center", fontsize=8, color="red")
        fig.suptitle(f"row {picture['row']}, query head {picture['head']}: dark = a key the query sees",
                     fontsize=9)
    else:
        heads = np.arange(len(picture["right"]))
        fig, ax = plt.subplots(figsize=(1.5 + 0.35 * len(heads), 2.6))
        ax.step(heads, picture["right"], where="mid", color="grey", label="right: h // G")
        got = [(h, kv) for h, kv in zip(heads, picture["yours"]) if kv is not None]
        if got:
            ax.scatter(*zip(*got), color="red", zorder=3, label="yours")
        ax.set_xlabel("query head h")
        ax.set_ylabel("KV head read")
        ax.set_xticks(heads)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
