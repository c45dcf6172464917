"""The planted variants, served from the parent to the candidate's own tests (part of the run stage).

Under the control and under every planted mistake, the own-tests process runs
the same wrapper (``grader/child/owntests.py``): it calls the submission's own
``append`` and ``gqa_attention``, then sends each call's outcome here and uses
the outcome it gets back. Only this process knows which task runs which
variant, so nothing the submission's process can read, in its memory, frames
or files, tells a mutant from the control: only outcomes do, as they would
tell a real mistake from a right implementation.

What a mistake does is the catalogue's (``catalogue/mutants.py``, applied here
to the oracle's attention). For the control, and for mistakes an outcome does
not show, the submission's own outcome goes back unchanged. Every call does the
work of every variant, so the reply's timing does not tell them apart either.

Everything that arrives is the child's data: arrays rebuilt from raw bytes of
a few dtypes (``protocol.unpack_arrays``), shapes checked against the contract
before any work, work bounded by ``MAX_WORK``. Nothing is unpickled or run.
"""
from __future__ import annotations

import numpy as np

from catalogue import mutants
from grader import oracle
from grader.child import protocol

# The mistakes whose planted outcome differs in an attention call, and in an append.
ATTENTION = [m for m in mutants.PLANTED if m in mutants.WINDOWS or m in ("modulo_head_mapping", "missing_scale",
                                                                        "nan_padding")]
APPEND = ["length_before_write", "concat_growth"]
# Past this many multiply-adds of attention (B * Hq * T * S * d), a call keeps its own outcome under every
# variant: the oracle's per-query loop for every variant would take seconds. Tests of the contract need far less.
MAX_WORK = 2**26


class _Cache:
    """The cache a call describes, as the catalogue's mutants read it: ``k``, ``v`` float64
    ``[B, Hkv, max_len, d]`` and int64 ``lens`` ``[B]``, written by index."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=np.float64):
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=np.float64)
        self.v = np.zeros_like(self.k)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new) -> None:
        for b, n in enumerate(np.asarray(n_new, dtype=np.int64)):
            start = int(self.lens[b])
            self.k[b, :, start:start + n] = k_new[b, :, :n]
            self.v[b, :, start:start + n] = v_new[b, :, :n]
            self.lens[b] = start + n


def _attention(q, cache: _Cache, n_new):
    return oracle.attention_ref(q, cache.k, cache.v, cache.lens, n_new)


class _Replay:
    """An append already made in the own-tests process, replayed: the outcome the catalogue's
    ``append_as`` builds on (a ValueError, or the lengths after)."""

    def __init__(self, lens_before, lens_after, raised: bool, max_len: int):
        self.lens = np.array(lens_before, dtype=np.int64)
        self.k = self.v = np.zeros((len(self.lens), 0, max_len, 0))  # only the shape is read
        self.after, self.raised = np.array(lens_after, dtype=np.int64), raised

    @staticmethod
    def append(cache: "_Replay", k_new, v_new, n_new) -> None:
        if cache.raised:
            raise ValueError("the append raised")
        cache.lens[...] = cache.after


class Planted:
    """Answers the wrapped own-tests processes' calls of one session.

    ``variants`` maps each own-tests task's opaque name to its variant (``"none"``,
    ``mutants.CONTROL`` or a mistake of ``mutants.PLANTED``). ``served`` counts,
    per task, the calls answered and those whose own outcome was kept under every
    variant: too large (``too_large``), or outside the contract (``kept``).
    """

    def __init__(self, variants: dict):
        self.variants = dict(variants)
        self.served: dict = {}

    def serve(self, task: str, call, blob: bytes) -> tuple[dict, bytes]:
        """``(reply, blob)`` for one relayed call; never raises (a reply says what went wrong)."""
        counts = self.served.setdefault(task, {"calls": 0, "too_large": 0, "kept": 0})
        counts["calls"] += 1
        try:
            if not isinstance(call, dict):
                raise ValueError("a call that is not an object")
            arrays = protocol.unpack_arrays(call.get("arrays"), blob, np.frombuffer)
            if call.get("op") == "attention":
                return self._attention(task, arrays, counts)
            if call.get("op") == "append":
                return self._append(task, call, arrays, counts), b""
            raise ValueError(f"an unknown call {str(call.get('op'))[:40]!r}")
        except Exception as exc:  # noqa: BLE001 - raised before the variant is looked at: the same under every one
            return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}, b""

    def _attention(self, task: str, arrays: dict, counts: dict) -> tuple[dict, bytes]:
        q, k, v, lens, n_new, out = (arrays[n] for n in ("q", "k", "v", "lens", "n_new", "out"))
        outcomes = {}
        if _outside_contract(q, k, v, lens, n_new, out):
            counts["kept"] += 1  # the submission's own outcome, whatever the variant
        elif q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3] > MAX_WORK:
            counts["too_large"] += 1
        else:
            B, Hq, T, d = q.shape
            cache = _Cache(B, k.shape[1], k.shape[2], d)
            cache.append(k, v, lens)
            with np.errstate(all="ignore"):
                for mistake in ATTENTION:  # every one, whichever is asked: the same work under every variant
                    outcomes[mistake] = np.asarray(mutants.attention_as(mistake, _Cache, _attention, q, cache,
                                                                        n_new), dtype=np.float64).astype(out.dtype)
        chosen = outcomes.get(self.variants.get(task), out)
        meta, data = protocol.pack_arrays({"out": np.ascontiguousarray(chosen)})
        return {"ok": True, "arrays": meta}, data

    def _append(self, task: str, call: dict, arrays: dict, counts: dict) -> dict:
        before, after, n_new = (np.asarray(arrays[n], dtype=np.int64) for n in ("lens_before", "lens_after", "n_new"))
        max_len = call.get("max_len")
        kept = {"lens": None, "reallocate": False}
        if not (before.ndim == after.ndim == n_new.ndim == 1 and len(before) == len(after) == len(n_new)
                and isinstance(max_len, int) and not isinstance(max_len, bool) and 0 <= max_len < 2**31):
            counts["kept"] += 1
            return {"ok": True, **kept}
        outcomes = {}
        for mistake in APPEND:
            replay = _Replay(before, after, bool(call.get("raised")), max_len)
            k = replay.k
            try:
                mutants.append_as(mistake, _Replay.append, replay, None, None, n_new)
            except ValueError:
                pass
            moved = not np.array_equal(replay.lens, after)
            outcomes[mistake] = {"lens": replay.lens.tolist() if moved else None, "reallocate": replay.k is not k}
        return {"ok": True, **outcomes.get(self.variants.get(task), kept)}


def _outside_contract(q, k, v, lens, n_new, out) -> bool:
    """True when an attention call's arrays do not have the contract's shapes and ranges
    (decided before any variant is looked at)."""
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or out.shape != q.shape:
        return True
    B, Hq, T, d = q.shape
    if k.shape[0] != B or k.shape[3] != d or k.shape[1] == 0 or Hq % k.shape[1] or d == 0:
        return True
    if lens.shape != (B,) or n_new.shape != (B,) or out.dtype.kind != "f" or q.dtype.kind != "f":
        return True
    return bool((n_new < 0).any() or (n_new > T).any() or (n_new > lens).any() or (lens > k.shape[2]).any())
