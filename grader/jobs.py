"""Trials as data for the child, and the child's outputs split back per step.

The job's JSON holds shapes, counts and offsets (data only); one flat float64
array holds every input. The child answers with one flat float64 blob per
implementation; :func:`split_outputs` checks its size against the records and
splits it per step. Nothing the child wrote is executed or unpickled.
"""
from __future__ import annotations

import io

import numpy as np

from grader.suite import Trial


def encode(trials: list[Trial]) -> tuple[dict, np.ndarray]:
    """``(spec, data)``: the trials as JSON-able shapes and offsets plus one flat float64 array."""
    chunks, offset = [], 0

    def ref(array):
        nonlocal offset
        chunks.append(np.asarray(array, dtype=np.float64).ravel())
        start, offset = offset, offset + array.size
        return [start, list(array.shape)]

    spec = {"trials": []}
    for trial in trials:
        spec["trials"].append({
            "name": trial.name, "B": trial.B, "Hkv": trial.Hkv, "G": trial.G, "d": trial.d,
            "max_len": trial.max_len, "dtype": trial.dtype,
            "steps": [{"k": ref(s.k_new), "v": ref(s.v_new), "q": ref(s.q), "n_new": s.n_new.tolist(),
                       **({"overflow": True} if s.overflow else {})}
                      for s in trial.steps],
        })
    return spec, (np.concatenate(chunks) if chunks else np.zeros(0))


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as the bytes of a ``.npy`` file (no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def split_outputs(blob: bytes, trials: list[Trial], records) -> list[list]:
    """Split the child's flat float64 output into per-step arrays ``[B, Hq, T, d]`` (None where absent).

    Raises:
        ValueError: the blob is not exactly the size the records announce, or
            the records do not have the trials' structure.
    """
    if len(blob) % 8:
        raise ValueError("the outputs are not a whole number of float64 values")
    flat = np.frombuffer(blob, dtype="<f8")
    if not isinstance(records, list) or len(records) != len(trials):
        raise ValueError(f"records for {len(records) if isinstance(records, list) else '?'} "
                         f"trials, expected {len(trials)}")
    outputs, offset = [], 0
    for trial, steps in zip(trials, records):
        per_step = []
        if not isinstance(steps, list) or len(steps) > len(trial.steps):
            raise ValueError(f"malformed records for trial {trial.name}")
        for step, record in zip(trial.steps, steps):
            if isinstance(record, dict) and record.get("stored"):
                shape = step.q.shape
                size = int(np.prod(shape))
                if offset + size > flat.size:
                    raise ValueError("the outputs are shorter than the records announce")
                per_step.append(flat[offset:offset + size].reshape(shape))
                offset += size
            else:
                per_step.append(None)
        outputs.append(per_step)
    if offset != flat.size:
        raise ValueError(f"{flat.size - offset} output values more than the records announce")
    return outputs
