"""The planted variants, served from the parent to the candidate's own tests (part of the run stage).

Under the control and under every planted mistake, the own-tests process runs
the same wrapper (``grader/child/run_own_tests.py``): it calls the submission's own
``append`` and ``gqa_attention``, then sends each call's outcome here and uses
the outcome it gets back. Only this process knows which task runs which
variant, so nothing the submission's process can read, in its memory, frames
or files, tells a mutant from the control: only outcomes do, as they would
tell a real mistake from a right implementation.

A mutant's outcome is the submission's own, with exactly the query slots the
mistake changes replaced by what the mistake gives there (computed on the
direct reference below). Where a mistake is silent (a chunk-local mask at
decode), the reply is the submission's outcome bit for bit, as for the
control. Every call does the work of every variant, so the reply's timing does
not tell them apart either. What each mistake does is the catalogue's
(``catalogue/mutants.py`` plants the same mistakes around an implementation
for the learner; ``tests/test_owntests.py`` checks that both agree).

Everything that arrives is the child's data: arrays rebuilt from raw bytes of
a few dtypes (``protocol.unpack_arrays``), shapes checked against the contract
before any work, the work and memory of a call bounded (``LIMITS``). Nothing
is unpickled or run.
"""
from __future__ import annotations

import math

import numpy as np

from catalogue import mutants, rules
from grader.child import protocol

# The mistakes whose planted outcome differs in an attention call, and in an append.
ATTENTION = [m for m in mutants.PLANTED if m in mutants.WINDOWS or m in ("modulo_head_mapping", "missing_scale",
                                                                        "nan_padding")]
APPEND = ["length_before_write", "concat_growth"]
# Bounds on one attention call the parent computes (the same for every variant): past any of them the call
# keeps its own outcome under every variant. They bound the float64 arrays the computation holds at once
# (a few of [B, Hq, T, S] scores, 4 MiB each; [B, Hkv, S, d] keys; [B, Hq, T, d] queries), its Python
# loops (B * T query slots) and its work (B * Hq * T * S * d multiply-adds), so that a call costs the
# parent at most about 0.2 s of CPU for all variants together. Tests of the contract need far less. A size
# of 0 counts as 1: the computation still holds arrays of the other sizes (an empty chunk, T = 0, of a
# million query heads is a few bytes on the line and megabytes of head indices here).
LIMITS = {"B*Hq*T*S": 2**19, "B*Hkv*S*d": 2**21, "B*Hq*T*d": 2**21, "B*T": 2**14, "B*Hq*T*S*d": 2**24}
MAX_ROWS = 2**16  # rows of an append the parent replays (its reply lists each row's length)


def _over_limits(B: int, Hq: int, Hkv: int, T: int, S: int, d: int) -> bool:
    B, Hq, Hkv, T, S, d = (max(int(n), 1) for n in (B, Hq, Hkv, T, S, d))
    sizes = {"B*Hq*T*S": B * Hq * T * S, "B*Hkv*S*d": B * Hkv * S * d, "B*Hq*T*d": B * Hq * T * d, "B*T": B * T,
             "B*Hq*T*S*d": B * Hq * T * S * d}
    return any(sizes[name] > limit for name, limit in LIMITS.items())


class _Reference:
    """A direct reference for one call, with the rules a mistake changes as arguments.

    ``q`` ``[B, Hq, T, d]``, ``k`` and ``v`` ``[B, Hkv, S, d]``, float64. Query head ``h = j * G + g``
    sits in group ``j``, which reads KV head ``j``: K and V broadcast over the group, never repeated.
    """

    def __init__(self, q, k, v):
        self.q, self.k, self.v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
        self.B, self.Hq, self.T, self.d = self.q.shape
        self.Hkv, self.S = self.k.shape[1], self.k.shape[2]
        self.G = self.Hq // self.Hkv

    def scores(self, q) -> np.ndarray:
        """Unscaled ``q k^T`` of every query head against the KV head of its group: ``[B, Hkv, G, T, S]``."""
        return q.reshape(self.B, self.Hkv, self.G, self.T, self.d) @ self.k[:, :, None].swapaxes(-1, -2)

    def attend(self, scores, scale: float, visible) -> np.ndarray:
        """float64 ``[B, Hq, T, d]``: slot ``t`` of row ``b`` weighs keys ``0 .. visible[b, t] - 1``
        (int ``[B, T]``; 0: none, the output is 0) by ``softmax(scale * scores)``."""
        seen = (np.arange(self.S)[None, None, :] < visible[:, :, None])[:, None, None]  # [B, 1, 1, T, S]
        logits = np.where(seen, scores * scale, -np.inf)
        peak = logits.max(axis=-1, keepdims=True) if self.S else np.zeros(logits.shape[:-1] + (1,))
        weights = np.exp(logits - np.where(np.isfinite(peak), peak, 0.0))
        total = weights.sum(axis=-1, keepdims=True)
        out = (weights / np.where(total > 0, total, 1.0)) @ self.v[:, :, None]
        return out.reshape(self.B, self.Hq, self.T, self.d)


def _planted_outcomes(q, k, v, lens, n_new, out) -> dict:
    """``{mistake: its outcome of this call}`` for every mistake of ``ATTENTION``: ``out`` (the
    submission's own), with the slots the mistake changes replaced by the reference's values there."""
    ref = _Reference(q, k, v)
    B, Hq, T, d = ref.q.shape
    real = np.arange(T)[None, :] < n_new[:, None]  # [B, T]: slots past n_new[b] are padding
    position = (lens - n_new)[:, None] + np.arange(T)[None, :]
    # The right window of each slot is keys 0 .. its count - 1 (the mask rule's bottom-right default).
    right_keys = rules.visible(lens, n_new, T, int(lens.max()) if B else 0).sum(axis=-1)
    scale = 1.0 / math.sqrt(d)
    raw = ref.scores(ref.q)
    right = ref.attend(raw, scale, right_keys)
    planted = {}
    for mistake in ATTENTION:
        nan = np.zeros((B, T), dtype=bool)
        if mistake in mutants.WINDOWS:
            rule, S_max = mutants.WINDOWS[mistake], int(lens.max()) if B else 0
            seen = [[rule(int(position[b, t]), t, int(lens[b]), int(n_new[b]), T, S_max) if real[b, t] else 0
                     for t in range(T)] for b in range(B)]
            nan = np.array([[c is None for c in row] for row in seen], dtype=bool).reshape(B, T)
            result = ref.attend(raw, scale, np.array([[c or 0 for c in row] for row in seen],
                                                     dtype=np.int64).reshape(B, T))
        elif mistake == "modulo_head_mapping":
            # Query head h reads KV head h % Hkv: put it in the slot whose group reads that head.
            h = np.arange(Hq)
            slot = (h % ref.Hkv) * ref.G + h // ref.Hkv
            moved = np.empty_like(ref.q)
            moved[:, slot] = ref.q
            result = ref.attend(ref.scores(moved), scale, right_keys)[:, slot]
        elif mistake == "missing_scale":
            result = ref.attend(raw, 1.0, right_keys)
        else:  # nan_padding
            result, nan = right.copy(), ~real
        result[np.broadcast_to(nan[:, None, :, None], result.shape)] = np.nan
        planted[mistake] = result
    outcomes = {}
    for mistake, result in planted.items():
        # The slots the mistake changes (any of their d values), by the reference's own measure.
        changed = (~np.isclose(result, right, rtol=1e-9, atol=1e-12, equal_nan=True)).any(axis=-1, keepdims=True)
        outcomes[mistake] = np.where(changed, result.astype(out.dtype), out)
    return outcomes


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
    variant: too large (``too_large``), or outside the contract or not computable
    here (``kept``).
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
        elif _over_limits(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]):
            counts["too_large"] += 1
        else:
            try:
                with np.errstate(all="ignore"):  # every mistake's, whichever is asked: the same work under every one
                    outcomes = _planted_outcomes(q, k, v, lens, n_new, out)
            except Exception:  # noqa: BLE001 - the kit's own failure is never the tests': their outcome stands
                counts["kept"] += 1
        chosen = outcomes.get(self.variants.get(task), out)
        meta, data = protocol.pack_arrays({"out": np.ascontiguousarray(chosen)})
        return {"ok": True, "arrays": meta}, data

    def _append(self, task: str, call: dict, arrays: dict, counts: dict) -> dict:
        before, after, n_new = (np.asarray(arrays[n], dtype=np.int64) for n in ("lens_before", "lens_after", "n_new"))
        max_len = call.get("max_len")
        kept = {"lens": None, "reallocate": False}
        if not (before.ndim == after.ndim == n_new.ndim == 1 and len(before) == len(after) == len(n_new)
                and len(before) <= MAX_ROWS
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
