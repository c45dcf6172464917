"""Trials as data for the child, and the child's outputs split back per step.

The job's JSON holds shapes, counts and offsets (data only); one flat float64
array holds every input. The child answers with one flat float64 blob per
implementation; :func:`split_outputs` checks its size against the records and
splits it per step. Nothing the child wrote is executed or unpickled.
"""
from __future__ import annotations

import io

import numpy as np

from grader.stages.suite import Trial


class Flat:
    """Arrays laid end to end, one flat array per dtype; ``ref`` gives ``[offset, shape]`` in its dtype's array."""

    def __init__(self):
        self.chunks = {"float64": [], "float32": []}
        self.size = {"float64": 0, "float32": 0}

    def ref(self, array, dtype: str) -> list:
        array = np.asarray(array, dtype=dtype)
        self.chunks[dtype].append(array.ravel())
        start = self.size[dtype]
        self.size[dtype] += array.size
        return [start, list(array.shape)]

    def arrays(self) -> dict:
        return {d: (np.concatenate(c) if c else np.zeros(0, dtype=d)).astype(d, copy=False)
                for d, c in self.chunks.items()}

    def save(self, dtype: str, path: str) -> None:
        """Write the flat array of ``dtype`` to ``path`` as a ``.npy`` file (no pickle), chunk by chunk:
        the probes' ~300 MiB are never laid end to end in memory first."""
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                     "shape": (self.size[dtype],)})
            for chunk in self.chunks[dtype]:
                f.write(np.ascontiguousarray(chunk, dtype=dtype).data)


def encode(trials: list[Trial], flat: Flat | None = None) -> tuple[dict, dict]:
    """``(spec, data)``: the trials as JSON-able shapes and offsets, and ``{dtype: flat array}``.

    Every input of a trial lies in the flat array of the trial's dtype, so the
    child hands the submission views of one mapped array whatever the trial
    (``flat`` lets the caller add more to the same arrays: the probes).
    """
    flat = flat or Flat()
    spec = {"trials": []}
    for trial in trials:
        ref = lambda array, dtype=trial.dtype: flat.ref(array, dtype)  # noqa: E731
        spec["trials"].append({
            "name": trial.name, "B": trial.B, "Hkv": trial.Hkv, "G": trial.G, "d": trial.d,
            "max_len": trial.max_len, "dtype": trial.dtype,
            "steps": [{"k": ref(s.k_new), "v": ref(s.v_new), "q": ref(s.q), "n_new": s.n_new.tolist(),
                       **({"overflow": True} if s.overflow else {})}
                      for s in trial.steps],
        })
    return spec, flat.arrays()


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
