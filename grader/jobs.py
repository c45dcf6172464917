"""Trials as files for the child, and the child's answers read back safely.

A job directory holds ``job.json`` (shapes, counts, offsets: data only) and one
flat float64 ``data.npy`` with every input. The child answers with
``results.json`` and flat ``out.npy``/``out_torch.npy``; ``read_outputs`` loads
them with ``allow_pickle=False``, checks dtype, rank and size, and splits them
per step. Nothing the child wrote is executed or unpickled.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from grader.sandbox import open_child_file

from grader.trials import Trial

RESULTS_LIMIT = 32 * 2**20  # bytes of results.json the parent will parse
OUTPUT_LIMIT = 256 * 2**20  # bytes of out.npy the parent will load
TEXT_LIMIT = 300  # characters of any string the child reports


def clip(value, depth: int = 0):
    """The child's JSON made safe to keep: strings cut to TEXT_LIMIT, bounded depth, finite numbers.

    Raises:
        ValueError: nesting deeper than 40 or a non-finite number.
    """
    if depth > 40:
        raise ValueError("results nested too deep")
    if isinstance(value, str):
        return value[:TEXT_LIMIT]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a non-finite number in the results")
    if isinstance(value, list):
        return [clip(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k)[:80]: clip(v, depth + 1) for k, v in value.items()}
    return value


def encode(trials: list[Trial], probes=(), torch: bool = False) -> tuple[dict, np.ndarray]:
    """``(spec, data)``: the trials as JSON-able shapes and offsets plus one flat float64 array."""
    chunks, offset = [], 0

    def ref(array):
        nonlocal offset
        chunks.append(np.asarray(array, dtype=np.float64).ravel())
        start, offset = offset, offset + array.size
        return [start, list(array.shape)]

    spec = {"trials": [], "probes": list(probes), "torch": bool(torch)}
    for trial in trials:
        spec["trials"].append({
            "name": trial.name, "B": trial.B, "Hkv": trial.Hkv, "G": trial.G, "d": trial.d,
            "max_len": trial.max_len, "dtype": trial.dtype,
            "steps": [{"k": ref(s.k_new), "v": ref(s.v_new), "q": ref(s.q), "n_new": s.n_new.tolist()}
                      for s in trial.steps],
        })
    return spec, (np.concatenate(chunks) if chunks else np.zeros(0))


def pack(trials: list[Trial], job_dir: str, probes=(), torch: bool = False, **extra) -> None:
    """Write ``trials`` as ``job.json`` + ``data.npy`` into ``job_dir`` (``extra``: more JSON keys)."""
    spec, data = encode(trials, probes, torch)
    spec.update(extra)
    os.makedirs(job_dir, exist_ok=True)
    np.save(os.path.join(job_dir, "data.npy"), data, allow_pickle=False)
    with open(os.path.join(job_dir, "job.json"), "w") as f:
        json.dump(spec, f)


def read_results(job_dir: str) -> dict | None:
    """The child's ``results.json`` as data, or None if missing, oversized or malformed."""
    return read_json(os.path.join(job_dir, "results.json"))


def read_json(path: str) -> dict | None:
    """A JSON object the child wrote, clipped (see ``clip``), or None if unsafe, missing or malformed."""
    try:
        with open_child_file(path, RESULTS_LIMIT) as f:
            results = clip(json.load(f))
    except (OSError, ValueError, RecursionError):
        return None
    return results if isinstance(results, dict) else None


def read_outputs(job_dir: str, name: str, trials: list[Trial], records) -> list[list]:
    """Split the child's flat output into per-step arrays ``[B, Hq, T, d]`` (None where absent).

    Raises:
        ValueError: the file is not a 1-D float64 array of exactly the size the
            records announce, or the records do not have the trials' structure.
    """
    path = os.path.join(job_dir, name)
    try:
        with open_child_file(path, OUTPUT_LIMIT) as f:
            flat = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        flat = np.zeros(0)
    if flat.dtype != np.float64 or flat.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D float64 array, got {flat.dtype} {flat.shape}")
    if not isinstance(records, list) or len(records) != len(trials):
        raise ValueError(f"{name}: records for {len(records) if isinstance(records, list) else '?'} "
                         f"trials, expected {len(trials)}")
    outputs, offset = [], 0
    for trial, steps in zip(trials, records):
        per_step = []
        if not isinstance(steps, list) or len(steps) > len(trial.steps):
            raise ValueError(f"{name}: malformed records for trial {trial.name}")
        for step, record in zip(trial.steps, steps):
            if isinstance(record, dict) and record.get("stored"):
                shape = step.q.shape
                size = int(np.prod(shape))
                if offset + size > flat.size:
                    raise ValueError(f"{name}: shorter than the records announce")
                per_step.append(flat[offset:offset + size].reshape(shape))
                offset += size
            else:
                per_step.append(None)
        outputs.append(per_step)
    if offset != flat.size:
        raise ValueError(f"{name}: {flat.size - offset} values more than the records announce")
    return outputs
