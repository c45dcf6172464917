"""Compare a submission's outputs with the oracle, step by step, in the parent.

Each step is classified by what it exercises (see docs/contract.md): ``decode``
(T = 1, every row one new token), ``full_prefill`` (every row receives its
whole content in one call, T = S), ``chunked_prefill`` (every row receives
T > 1 tokens after earlier ones, T < S), each only when every row has received
the same tokens in every call since the cache was empty, with no padded slot (``UNIFORM``), and ``ragged``
(anything else: rows of different lengths now or before, zero-token rows,
padded slots); ``edge`` steps (B = 0, T = 0, an all-empty cache) only add notes;
``overflow`` and ``after_overflow`` steps decide the overflow criterion;
``structure`` steps (``q = 0``, one-hot values) are read by diagnosis only. Hire's
checks use the first three; ``ragged`` is a Strong Hire check. Real query slots are compared with the tolerance; padded slots are
checked apart (exactly 0, finite, or not).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from grader.stages.oracle import ReferenceHistory
from grader.stages.suite import Trial, hidden_suite

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


# The kinds of rows that have had the same length and received the same tokens in every call since the cache
# was empty, with no padded slot: Hire's checks, and the only steps the chunked-prefill check reads.
UNIFORM = ("decode", "full_prefill", "chunked_prefill")


def step_kinds(trial: Trial) -> list[str]:
    """The kind of each step of ``trial`` (see the module docstring)."""
    if trial.group == "structure":
        return ["structure"] * len(trial.steps)  # read by diagnosis only
    return history_kinds(trial)


def history_kinds(trial: Trial) -> list[str]:
    """The kind each step's history gives it, whatever the trial's group: for a structure trial, which of
    its steps are uniform (``UNIFORM``) and which ragged, so diagnosis reads them as the criteria do."""
    kinds, lens, overflowed = [], np.zeros(trial.B, dtype=np.int64), False
    history_uniform = True  # every call so far gave every row all of its T slots (n_new[b] == T)
    for step in trial.steps:
        if step.overflow:
            kinds.append("overflow")  # changes nothing
            overflowed = True
            continue
        if overflowed:
            kinds.append("after_overflow")  # judged with the overflow: it shows whether the state changed
            lens = lens + step.n_new
            continue
        n, T = step.n_new, step.q.shape[2]
        before, lens = lens, lens + n
        # Hire's steps: rows that received the same tokens in every call since the cache was empty, with no
        # padded slot in any of those calls. Rows that are equal now after a ragged or padded history are a
        # ragged-rows case (a shared position is right only while every row has always moved together, and
        # one advanced by T, padding included, only while no call had padding).
        uniform = trial.B > 0 and T > 0 and (n == T).all() and history_uniform
        history_uniform = history_uniform and bool((n == T).all())
        if trial.B == 0 or T == 0 or not lens.any():
            kinds.append("edge")  # B = 0, T = 0, an all-empty cache: notes, not a criterion
        elif not uniform:
            kinds.append("ragged")
        elif T == 1 and before[0] > 0:
            kinds.append("decode")
        elif before[0] == 0:
            kinds.append("full_prefill")
        else:
            kinds.append("chunked_prefill")
    return kinds


@lru_cache(maxsize=4)
def oracle_outputs(seed: int, count: int) -> tuple:
    """``(trials, expected)``: the hidden suite for ``seed`` and the oracle's output of every step."""
    suite = hidden_suite(seed, count)
    return suite, expected_outputs(suite)


def expected_outputs(trials: list[Trial]) -> list[list[np.ndarray]]:
    """The oracle's float64 output ``[B, Hq, T, d]`` for every step of every trial."""
    expected = []
    for trial in trials:
        history = ReferenceHistory(trial.B, trial.Hkv, trial.d)
        per_step = []
        for step in trial.steps:
            if step.overflow:
                per_step.append(None)  # must raise and change nothing: no output
                continue
            history.append(step.k_new, step.v_new, step.n_new)
            per_step.append(history.expected(step.q, step.n_new))
        expected.append(per_step)
    return expected


@dataclass
class StepVerdict:
    """What one step did: ``ok``, ``wrong``, ``raised``, ``bad_output`` or ``not_run``."""

    trial: Trial
    index: int
    kind: str
    status: str
    detail: str = ""
    error: dict | None = None
    max_error: float = 0.0
    padding: str = "none"  # "none" (no padded slot), "zero", "finite", "nonfinite"
    dtype_ok: bool = True
    buffers_moved: bool = False  # the cache's k/v were other objects after this step's append
    chunk_after_prefix: bool = False  # some row appends 2+ tokens after cached tokens (a refusable call)
    wide_after_prefix: bool = False  # T > 1 and some row that holds tokens gets one or more: a call with T < S
    # ``bad_output`` from a call that returned without raising (a wrong type, dtype kind or shape): as silently
    # wrong as a wrong number, and counted so (``criteria.correctness``).
    returned_bad: bool = False


@dataclass
class Comparison:
    """Every step's verdict, grouped for the criteria."""

    steps: list[StepVerdict] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[StepVerdict]:
        return [s for s in self.steps if s.kind == kind]

    def in_trials(self, prefix: str) -> list[StepVerdict]:
        return [s for s in self.steps if s.trial.name.startswith(prefix)]


def _real_mask(step, shape) -> np.ndarray:
    """Boolean ``[B, Hq, T, d]``: True on real query slots (t < n_new[b])."""
    B, Hq, T, d = shape
    real = np.arange(T)[None, :] < step.n_new[:, None]
    return np.broadcast_to(real[:, None, :, None], shape)


def compare(trials: list[Trial], records: list, outputs: list, expected: list) -> Comparison:
    """Verdicts for every step, from the child's ``records``/``outputs`` and the oracle's ``expected``."""
    result = Comparison()
    for trial, steps_rec, steps_out, steps_exp in zip(trials, records, outputs, expected):
        kinds = step_kinds(trial)
        tol = TOLERANCE.get(trial.dtype, 1e-5)
        # Steps may be left out only after an append (or the constructor) raised: the trial's history
        # is then unknown. Any other gap is the child's answer missing, and counts against it.
        stopped = False
        lens = np.zeros(trial.B, dtype=np.int64)
        for i, step in enumerate(trial.steps):
            verdict = StepVerdict(trial, i, kinds[i], "not_run")
            if not step.overflow:
                # A chunk for some row: more than one token to a row that holds tokens already.
                verdict.chunk_after_prefix = bool(((lens > 0) & (step.n_new > 1)).any())
                verdict.wide_after_prefix = step.q.shape[2] > 1 and bool(((lens > 0) & (step.n_new > 0)).any())
                lens = lens + step.n_new
            result.steps.append(verdict)
            record = steps_rec[i] if i < len(steps_rec) else None
            if not isinstance(record, dict):
                if stopped:
                    verdict.detail = "not run: an earlier append in this trial failed"
                else:
                    verdict.status = "bad_output"
                    verdict.detail = "no answer for this step (the trial stopped without a failed append)"
                continue
            if record.get("stage") in ("init", "append"):
                stopped = True
            if step.overflow:
                error = record.get("error") if record.get("stage") == "overflow" else None
                verdict.error = error or {}
                if not isinstance(error, dict):
                    verdict.status, verdict.detail = "wrong", "an append past max_len raised nothing"
                elif not error.get("value_error"):
                    verdict.status = "bad_output"
                    verdict.detail = f"an append past max_len raised {error.get('type')}, not ValueError"
                else:
                    verdict.status = "ok"
                continue
            if record.get("stage") in ("init", "append", "attention"):
                verdict.status, verdict.error = "raised", record.get("error") or {}
                verdict.detail = f"{record['stage']} raised {verdict.error.get('type', '?')}: {verdict.error.get('message', '')}"
                continue
            verdict.buffers_moved = record.get("buffers_moved") is True
            got = steps_out[i]
            if got is None:
                verdict.status, verdict.returned_bad = "bad_output", True
                verdict.detail = (f"returned {record.get('type')} of shape {record.get('shape')} and dtype "
                                  f"{record.get('dtype')}; expected an array of shape {list(step.q.shape)}")
                continue
            verdict.dtype_ok = record.get("dtype") == trial.dtype
            real = _real_mask(step, got.shape)
            want = steps_exp[i]
            diff = np.abs(np.where(real, got, 0.0) - np.where(real, want, 0.0))
            with np.errstate(invalid="ignore"):
                bad = ~(diff <= tol * np.maximum(1.0, np.abs(want)))
            verdict.max_error = float(np.nanmax(np.where(np.isfinite(diff), diff, np.inf))) if diff.size else 0.0
            padded = got[~real]
            if padded.size:
                verdict.padding = ("nonfinite" if not np.isfinite(padded).all()
                                   else "zero" if not padded.any() else "finite")
            verdict.status = "wrong" if bad.any() else "ok"
    return result


def first_failure(steps: list[StepVerdict]) -> StepVerdict | None:
    """The failing step of the smallest trial (then the earliest step), among ``steps``."""
    failing = [s for s in steps if s.status != "ok"]
    return min(failing, key=lambda s: (s.trial.size, s.index)) if failing else None
