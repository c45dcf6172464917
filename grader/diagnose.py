"""Name the mistake behind a wrong output, and find the smallest failing case.

A wrong trial is replayed in the parent through every planted variant of the
catalogue (``catalogue.mutants``, planted around the reference solution: all
trusted code). A variant whose outputs equal the submission's on every step of
the trial names the mistake. When no variant matches, the pattern of which
kinds of step fail may still name it (``infer``); otherwise the report says the
output is wrong and that no known mistake matched.
"""
from __future__ import annotations

import types

import numpy as np

from catalogue import mutants
from grader import jobs
from grader.child import tasks as child_tasks
from grader.compare import Comparison
from grader.suite import Trial
from solutions import kv_cache as reference

MATCH_TOLERANCE = {"float64": 1e-8, "float32": 1e-4}
# nan_padding is measured directly on padded slots, never by matching real ones.
MATCHABLE = {variant: mistake for mistake, variants in mutants.VARIANTS.items()
             if mistake != "nan_padding" for variant in variants}


def _run_variant(variant: str, trial: Trial) -> list:
    KVCache, attention = mutants.plant(variant, reference.KVCache, reference.gqa_attention)
    spec, data = jobs.encode([trial])
    records, flat = child_tasks.run_trials(types.SimpleNamespace(KVCache=KVCache, gqa_attention=attention),
                                       spec["trials"], data)
    flat = iter(flat)
    return [next(flat).reshape(s.q.shape) if i < len(records[0]) and records[0][i].get("stored") else None
            for i, s in enumerate(trial.steps)]


def _matches(trial: Trial, got: list, want: list) -> bool:
    tol = MATCH_TOLERANCE.get(trial.dtype, 1e-4)
    compared = False
    for step, g, w in zip(trial.steps, got, want):
        if step.overflow:
            continue  # no output: its effect shows in the steps after it
        if g is None or w is None:
            return False
        real = np.broadcast_to((np.arange(g.shape[2])[None, :] < step.n_new[:, None])[:, None, :, None], g.shape)
        defined = real & ~np.isnan(w)
        if defined.any():
            compared = True
            if not np.allclose(g[defined], w[defined], rtol=tol, atol=tol):
                return False
    return compared


def match_mutants(comparison: Comparison, outputs_by_trial: dict, limit: int = 4) -> dict[str, str]:
    """``{mistake_id: evidence}`` for planted variants that reproduce a wrong trial exactly.

    ``outputs_by_trial`` maps a trial's name to the submission's per-step outputs.
    Only the ``limit`` smallest wrong trials are replayed (diagnosis costs time).
    """
    wrong = {s.trial.name: s.trial for s in comparison.steps if s.status == "wrong"}
    matches = []  # per examined trial: {mistake: variant} that reproduce it exactly
    for trial in sorted(wrong.values(), key=lambda t: t.size)[:limit]:
        got = outputs_by_trial[trial.name]
        found = {}
        for variant, mistake in MATCHABLE.items():
            if mistake not in found and _matches(trial, got, _run_variant(variant, trial)):
                found[mistake] = f"outputs equal the planted '{variant}' mutant on {trial.describe()}"
        if found:
            matches.append(found)
    # A small trial can be reproduced by two mistakes at once (a chunk after one
    # cached token looks like "one key too few"); keep the names that explain
    # every trial something explained, else the ones that explain the most.
    counts = {}
    for found in matches:
        for mistake in found:
            counts[mistake] = counts.get(mistake, 0) + 1
    if not counts:
        return {}
    best = max(counts.values())
    keep = [m for m, n in counts.items() if n == len(matches)] or [m for m, n in counts.items() if n == best]
    return {m: next(f[m] for f in matches if m in f) for m in keep}


def infer(criteria: dict, comparison: Comparison) -> dict[str, str]:
    """Mistakes named by which checks fail together, when no mutant matched exactly."""
    status = {cid: c.status for cid, c in criteria.items()}
    named = {}
    uniform_ok = status.get("decode") == "pass" and status.get("full_prefill") == "pass"
    chunked = [s for s in comparison.of_kind("chunked_prefill") if s.status == "wrong"]
    if uniform_ok and chunked:
        named["chunk_local_mask"] = ("decode and full prefill are right, chunked prefill (1 < T < S) is wrong: "
                                     "the mask is not aligned to the end of the cache")
    ragged = [s for s in comparison.of_kind("ragged") if s.status == "wrong"]
    if uniform_ok and status.get("chunked_prefill") == "pass" and ragged:
        named["ragged_keys_unmasked"] = ("every check on rows of one length passes; rows of different lengths "
                                         "are wrong: a shorter row attends past its own length")
    head_map = comparison.in_trials("head-map-")
    trivial = [s for s in head_map if s.trial.Hkv == 1 or s.trial.G == 1]
    layouts = [s for s in head_map if s.trial.Hkv > 1 and s.trial.G > 1]
    if trivial and all(s.status == "ok" for s in trivial) and any(s.status == "wrong" for s in layouts):
        named["modulo_head_mapping"] = ("one-token rows are right when Hkv = 1 or G = 1 and wrong in real GQA "
                                        "layouts: query heads read the wrong KV head")
    return named


def smallest_failing(comparison: Comparison) -> str | None:
    """The smallest configuration whose step fails, in words (the small cases are tried in order of size)."""
    failing = [s for s in comparison.steps if s.status != "ok"]
    if not failing:
        return None
    step = min(failing, key=lambda s: (s.trial.size, s.index))
    what = {"wrong": "wrong output", "raised": step.detail, "bad_output": step.detail,
            "not_run": step.detail}[step.status]
    return f"{step.trial.describe()}; step {step.index + 1} ({step.kind.replace('_', ' ')}): {what}"
