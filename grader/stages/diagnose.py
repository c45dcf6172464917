"""Name the mistake behind a wrong output from what the submission was seen to do.

Two kinds of evidence, both outputs compared in this process:

* **Recovered structure** (``recover``). The structure trials give ``q = 0``
  and a one-hot value per token (``catalogue.structure``), so each output is
  the exact set of keys a query saw and the KV head it read. A mask, head-map
  or storage mistake is named only when the recovered structure is that
  mistake's pattern, query for query; the smallest such case is kept as a
  picture (the mask beside the right one, or the head map).
* **Exact reproduction** (``match_mutants``), for mistakes no structure shows
  (a missing ``1/sqrt(d)`` leaves every weight equal at ``q = 0``): a planted
  mutant of the catalogue whose outputs equal the submission's on a wrong trial.

Nothing is named by elimination: wrong outputs that show no known pattern are
reported as "wrong output, no known mistake" with the smallest failing case.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field

import numpy as np

from catalogue import mutants, rules, structure
from grader.stages import jobs, registry
from grader.child import tasks as child_tasks
from grader.stages.compare import UNIFORM, Comparison, history_kinds
from grader.stages.oracle import OracleCache, oracle_attention
from grader.stages.suite import Trial
from grader.stages.verdicts import Status

MATCH_TOLERANCE = {"float64": 1e-8, "float32": 1e-4}
# Mistakes told by exact reproduction of the hidden trials' outputs: missing_scale (right at q = 0), and the
# structural ones for code whose structure trials come out right (``grade._name_mistakes``): behaving
# differently at q = 0 then hides nothing.
REPRODUCED = {m: v for m, v in mutants.VARIANTS.items() if m not in ("nan_padding", "length_before_write")}
NO_KNOWN_MISTAKE = "wrong output, no known mistake"


@dataclass
class Diagnosis:
    """What recovery found: ``named`` ``{mistake: evidence}``, pictures of the first wrong case."""

    named: dict = field(default_factory=dict)
    mask: dict | None = None  # {"case", "row", "head", "keys", "yours", "right", "empty"}
    heads: dict | None = None  # {"case", "yours", "right"}
    wrong_outputs: bool = False  # some hidden step returned a wrong output (not only raised or refused)
    wrong_queries: int = 0
    unexplained: int = 0  # wrong queries that show no known pattern (or could not be decoded)

    def pictures(self) -> dict:
        return {k: v for k, v in (("mask", self.mask), ("heads", self.heads)) if v}


def _span(positions) -> str:
    """``{0, 1, 2, 5}`` as ``0..2, 5``."""
    out, run = [], []
    for p in sorted(positions):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(f"{run[0]}..{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [p]
    if run:
        out.append(f"{run[0]}..{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out) or "none"


def _queries(trial: Trial, outputs: list, comparison_steps: list):
    """Yield ``(step_index, b, h, t, pos, lens_before, lens_after, T, seen)`` for every real query answered."""
    lens = np.zeros(trial.B, dtype=np.int64)
    positions = trial.d // max(trial.B * trial.Hkv, 1)
    for i, step in enumerate(trial.steps):
        verdict = comparison_steps[i] if i < len(comparison_steps) else None
        before, lens = lens, lens + step.n_new
        got = outputs[i] if i < len(outputs) else None
        if verdict is None or verdict.status not in ("ok", "wrong") or got is None:
            if verdict is not None and verdict.status in ("raised", "not_run"):
                return  # the history after a failed call is unknown
            continue
        T = step.q.shape[2]
        for b in range(trial.B):
            for t in range(int(step.n_new[b])):
                for h in range(trial.Hq):
                    seen = structure.decode(got[b, h, t], trial.B, trial.Hkv, positions)
                    yield i, b, h, t, int(before[b]) + t, before, lens, T, seen


def recover(comparison: Comparison, outputs_by_trial: dict) -> Diagnosis:
    """Read the structure trials' outputs back into masks and head maps, and name what they show."""
    diag = Diagnosis()
    head_sets, mask_sets, examples = [], [], {}
    mask_uniform = []  # per entry of mask_sets: whether its query's rows have always moved together
    # Mask patterns shown by a wrong query that saw some key (or an empty slot). An output of exact zeros
    # (a query that saw nothing) fits a pattern that hides every key from it, but so does code that skips
    # the query: alone, it names nothing.
    shown_with_keys: set = set()
    for name in dict.fromkeys(s.trial.name for s in comparison.steps if s.kind == "structure"):
        steps = comparison.in_trials(name)
        trial = steps[0].trial
        uniform = [kind in UNIFORM for kind in history_kinds(trial)]
        layouts = structure.shared_position_windows([list(map(int, s.n_new)) for s in trial.steps],
                                                    [s.q.shape[2] for s in trial.steps])
        for i, b, h, t, pos, before, after, T, seen in _queries(trial, outputs_by_trial.get(name, []), steps):
            case = f"{trial.describe()}; step {i + 1}"
            if seen is None:
                diag.wrong_queries += 1
                diag.unexplained += 1
                continue
            heads, masks = structure.classify(seen, b, h, trial.Hkv, trial.G, pos, t, after, trial.steps[i].n_new, T,
                                              {p: w[(i, b, t)] for p, w in layouts.items()})
            if "right" in heads and "right" in masks:
                continue
            diag.wrong_queries += 1
            kv = next((kh for (_, kh, _) in seen.tokens), None)
            got = seen.positions(b, kv) if kv is not None else set()
            where = f"{case}, row {b}, query head {h}, slot {t}"
            if "right" not in heads:
                head_sets.append(heads)
                for p in heads:
                    examples.setdefault(p, f"{where} reads KV head {kv}; h // G = {h // trial.G}")
                if diag.heads is None and kv is not None:
                    diag.heads = _head_picture(trial, outputs_by_trial[name][i], b, t, case)
            if "right" not in masks:
                mask_sets.append(masks)
                mask_uniform.append(uniform[i])
                if got or seen.empty:
                    shown_with_keys |= masks
                empty = f" and {seen.empty} slot(s) holding no token" if seen.empty else ""
                for p in masks:
                    examples.setdefault(p, f"{where} (position {pos}) sees keys {_span(got)}{empty}; "
                                           f"the right window is 0..{pos}")
                if diag.mask is None:
                    diag.mask = _mask_picture(trial, outputs_by_trial[name][i], i, b, h, before, after, case)
            if not heads or not masks:
                diag.unexplained += 1
    judged = _judged_on_uniform_rows(mask_sets, mask_uniform)
    diag.unexplained += sum(1 for was, now in zip(mask_sets, judged) if was and not now)
    mask_sets = judged
    for sets, shown in ((head_sets, None), (mask_sets, shown_with_keys)):
        known = [s for s in sets if s]
        chosen = structure.explain(known) or set()
        if len(known) < len(sets):
            continue  # some wrong query shows no known pattern: name none of this part
        if shown is not None and not chosen <= shown:
            continue  # a pattern only queries that saw nothing show: not shown by the code's behaviour
        for pattern in sorted(chosen):
            shape = f" ({structure.SHAPES[pattern]})" if pattern in structure.SHAPES else ""
            diag.named.setdefault(structure.mistake_of(pattern),
                                  f"recovered with q = 0 and one-hot values{shape}: {examples[pattern]}")
    return diag


def _judged_on_uniform_rows(mask_sets: list, uniform: list) -> list:
    """``mask_sets`` with the patterns of a uniform-rows check kept for a query of ragged rows only when
    queries of uniform rows show them too.

    Decode, full prefill and chunked prefill are judged on rows that have always moved together (their
    mistakes, as the catalogue files them, are ``chunk_local_mask``, ``off_by_one_mask``, ...). A mask
    offset right there but wrong on ragged rows is a ragged-rows matter, even where one of its ragged
    queries happens to see the window such a pattern gives: only the ragged-rows patterns explain it.
    """
    foreign = {p for sets in mask_sets for p in sets if _criterion_of(structure.mistake_of(p)) != "ragged_rows"}
    if not foreign:
        return mask_sets
    shown = structure.explain([s for s, u in zip(mask_sets, uniform) if u]) or set()
    return [s if u else {p for p in s if p not in foreign or p in shown} for s, u in zip(mask_sets, uniform)]


def _criterion_of(mistake: str) -> str | None:
    """The rubric criterion the catalogue files ``mistake`` under (None for "right" or an unknown id)."""
    entry = rules.mistakes().get(mistake)
    return entry.criterion if entry is not None else None


def _mask_picture(trial, out, i, b, h, before, after, case) -> dict:
    """Every real query of row ``b``, head ``h`` in step ``i``: keys seen against the right window."""
    positions = trial.d // max(trial.B * trial.Hkv, 1)
    yours, right, empty = [], [], []
    for t in range(int(trial.steps[i].n_new[b])):
        seen = structure.decode(out[b, h, t], trial.B, trial.Hkv, positions)
        kv = next((kh for (_, kh, _) in seen.tokens), None) if seen else None
        yours.append(sorted(seen.positions(b, kv)) if seen and kv is not None else [])
        empty.append(seen.empty if seen else 0)
        right.append(list(range(int(before[b]) + t + 1)))
    return {"case": case, "row": b, "head": h, "keys": int(after[b]), "yours": yours, "right": right,
            "empty": empty}


def _head_picture(trial, out, b, t, case) -> dict:
    """The KV head each query head read (None when it cannot be told) against h // G."""
    positions = trial.d // max(trial.B * trial.Hkv, 1)
    yours = []
    for h in range(trial.Hq):
        seen = structure.decode(out[b, h, t], trial.B, trial.Hkv, positions)
        heads = {kh for (_, kh, _) in seen.tokens} if seen else set()
        yours.append(heads.pop() if len(heads) == 1 else None)
    return {"case": f"{case}, row {b}, slot {t}", "yours": yours, "right": [h // trial.G for h in range(trial.Hq)]}


def picture_lines(picture: dict, kind: str) -> list[str]:
    """The text grid of a mask picture, or the head map as two rows of numbers."""
    if kind == "mask":
        head = f"keys seen by row {picture['row']}, query head {picture['head']} ({picture['case']})"
        return [head, *structure.grid([set(r) for r in picture["yours"]], [set(r) for r in picture["right"]],
                                      picture["keys"], picture["empty"])]
    fmt = lambda xs: " ".join("?" if x is None else str(x) for x in xs)  # noqa: E731
    return [f"KV head read by each query head ({picture['case']})",
            f"  query head  {' '.join(str(h) for h in range(len(picture['right'])))}",
            f"  yours       {fmt(picture['yours'])}", f"  right       {fmt(picture['right'])}"]


def _run_variant(variant: str, trial: Trial) -> list:
    # Planted around the parent's own oracle: grading needs no reference solution.
    KVCache, attention = mutants.plant(variant, OracleCache, oracle_attention)
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


def match_mutants(comparison: Comparison, outputs_by_trial: dict, limit: int = 3,
                  mistakes: tuple | None = None) -> dict[str, str]:
    """``{mistake_id: evidence}`` for planted mutants (``REPRODUCED``) whose outputs equal a wrong trial's.

    A mistake is named only when it reproduces every one of the ``limit``
    smallest wrong trials exactly (diagnosis costs time; one trial could be a
    coincidence of two mistakes).
    """
    wrong = {s.trial.name: s.trial for s in comparison.steps if s.status == "wrong" and s.kind != "structure"}
    examined = sorted(wrong.values(), key=lambda t: t.size)[:limit]
    named = {}
    for mistake, variants in REPRODUCED.items():
        if mistakes is not None and mistake not in mistakes:
            continue
        for variant in variants:
            if examined and all(_matches(t, outputs_by_trial[t.name], _run_variant(variant, t)) for t in examined):
                named[mistake] = (f"outputs equal the planted '{variant}' mutant on the {len(examined)} smallest "
                                  f"wrong trials, e.g. {examined[0].describe()}")
                break
    return named


def smallest_failing(comparison: Comparison) -> str | None:
    """The smallest configuration whose step fails, in words (the small cases are tried in order of size).

    A step whose real slots are right but whose padded slots are NaN or inf
    counts as failing (the ``nan_padding`` case).
    """
    failing = [s for s in comparison.steps  # edge cases (B = 0, T = 0, an empty cache) are notes, not failures
               if s.kind not in ("structure", "edge") and (s.status != "ok" or s.padding == "nonfinite")]
    if not failing:
        return None
    step = min(failing, key=lambda s: (s.trial.size, s.index))
    what = {"wrong": "wrong output", "raised": step.detail, "bad_output": step.detail,
            "not_run": step.detail, "ok": "NaN or inf in padded query slots"}[step.status]
    return f"{step.trial.describe()}; step {step.index + 1} ({step.kind.replace('_', ' ')}): {what}"


def name_mistakes(criteria: dict, comparison: Comparison, outputs_by_trial: dict) -> tuple[dict, Diagnosis]:
    """``({mistake: evidence}, diagnosis)``: the mistakes ``criteria`` measured, then what the outputs show.

    ``criteria`` is ``{id: Criterion}`` of one implementation's section, the output checks among them.
    Mask, head-map and storage mistakes come from the structure recovered with ``q = 0`` (``recover``),
    and only when a hidden check of outputs fails; ``missing_scale`` from exact reproduction. Nothing by
    elimination. A mistake of a check judged on rows of one length (``registry.UNIFORM_ROWS``: decode, full
    or chunked prefill, the checks that can make a verdict Weak) is named only when that check fails: not
    from ragged rows alone (a mask offset wrong only on ragged rows is a ragged-rows matter), nor after a
    clear refusal of chunked prefill. Each name is attached to the criterion the catalogue files it under.
    """
    named = {}
    for crit in criteria.values():
        for m in crit.mistakes:
            named.setdefault(m, crit.evidence)
    diagnosed = set()  # the names the outputs gave (recovered structure, reproduction), not a criterion
    wrong = any(s.status == "wrong" for s in comparison.steps if s.kind != "structure")
    diagnosis = Diagnosis(wrong_outputs=wrong)
    if any(c.status == Status.FAIL for cid, c in criteria.items() if cid in registry.CORRECTNESS):
        diagnosis = recover(comparison, outputs_by_trial)
        diagnosis.wrong_outputs = wrong
        # Exact reproduction on the hidden trials: missing_scale always (q = 0 cannot show it); the structural
        # mistakes only when the structure trials came out right, as code that behaves differently at q = 0 does.
        reproduce = tuple(REPRODUCED) if diagnosis.wrong_queries == 0 else ("missing_scale",)
        shown = {**diagnosis.named, **match_mutants(comparison, outputs_by_trial, mistakes=reproduce)}
        diagnosed = set(shown) - set(named)
        named.update(shown)
    for m in sorted(diagnosed):
        cid = _criterion_of(m)
        if cid in registry.UNIFORM_ROWS and cid in criteria and criteria[cid].status != Status.FAIL:
            named.pop(m, None)
    for m in named:
        cid = _criterion_of(m)
        if cid in criteria and m not in criteria[cid].mistakes:
            criteria[cid].mistakes.append(m)
    return named, diagnosis
