"""In-process meters: for the learner's own code (the notebook's hidden tests, the step tests).

They run inside the process of the code they measure, so they can explain a
finding (which op, how many bytes) but never decide a grade of untrusted code:
the grader measures submissions from outside their process (``grader.stages.run``).
Thresholds are the grader's (``catalogue.rules.BOUNDS``).
"""
from __future__ import annotations

import tracemalloc

from catalogue.rules import BOUNDS, repeat_peak_limit
from grader.stages.criteria import Criterion


def _error(cid: str, probe) -> Criterion:
    if isinstance(probe, dict) and "error" in probe:
        err = probe["error"]
        return Criterion(cid, "error", f"the check raised {err.get('type')}: {err.get('message')}")
    return Criterion(cid, "error", "the check did not report")


def _traced(fn):
    """``(result, peak bytes allocated during fn)`` measured with tracemalloc.

    Tracing runs only around the measured call: always-on tracing slows every
    trial several times over.
    """
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak - before


def _shapes(seed: int, key: int):
    """A generator for one probe's sizes, drawn from the job's seed (no fixed shape to detect)."""
    import numpy as np

    return np.random.default_rng([seed, key])


def probe_in_place(mod, seed: int = 0):
    """Buffer identity and bytes allocated by a one-token append at growing lengths.

    Each length gets a fresh cache filled by one full prefill and then decode
    steps only, so a submission that refuses chunked prefill is still measured.
    """
    import numpy as np

    rng = _shapes(seed, 10)
    B, Hkv, d = int(rng.integers(1, 4)), int(rng.choice([1, 2, 4])), int(rng.choice([32, 48, 64]))
    max_len = int(rng.integers(3200, 5000))
    allocs, same, shares = [], True, True
    one = rng.standard_normal((B, Hkv, 1, d)).astype(np.float32)
    ones = np.ones(B, dtype=np.int64)
    for target in (64, 1024, 3072):
        cache = mod.KVCache(B, Hkv, max_len, d, dtype=np.float32)
        k0, v0 = cache.k, cache.v
        chunk = rng.standard_normal((B, Hkv, target, d)).astype(np.float32)
        cache.append(chunk, chunk, np.full(B, target))
        cache.append(one, one, ones)  # warm-up: first-call costs are not growth
        _, peak = _traced(lambda: cache.append(one, one, ones))
        allocs.append([target + 2, int(peak), int(2 * B * Hkv * (target + 2) * d * 4)])
        same = same and cache.k is k0 and cache.v is v0
        shares = shares and bool(np.shares_memory(np.asarray(cache.k), k0))
    return {"same_objects": same, "shares_memory": shares, "allocs": allocs}


def probe_repeat(mod, seed: int = 0):
    """Peak bytes allocated by one decode step at G = 8, against the live K/V bytes."""
    import numpy as np

    rng = _shapes(seed, 11)
    B, Hkv, G, S, d = int(rng.integers(1, 4)), int(rng.choice([1, 2])), 8, int(rng.integers(700, 1400)), 64
    cache = mod.KVCache(B, Hkv, S + int(rng.integers(0, 64)), d, dtype=np.float32)
    kv = rng.standard_normal((B, Hkv, S, d)).astype(np.float32)
    cache.append(kv[:, :, :-1], kv[:, :, :-1], np.full(B, S - 1))
    cache.append(kv[:, :, -1:], kv[:, :, -1:], np.ones(B, dtype=np.int64))
    q = rng.standard_normal((B, Hkv * G, 1, d)).astype(np.float32)
    _, peak = _traced(lambda: mod.gqa_attention(q, cache, np.ones(B, dtype=np.int64)))
    return {"peak_bytes": int(peak), "live_kv_bytes": int(2 * B * Hkv * S * d * 4), "G": G}


def op_watch():
    """The kit's one op recorder, ``OpWatch`` of ``exercises/tests/opwatch.py`` (the learner's step 6, the starter
    bundle and the notebook's helpers use the same file): a TorchDispatchMode that records every ATen op a block
    runs. Imported when first asked for, as it needs torch."""
    from exercises.tests.opwatch import OpWatch

    return OpWatch


def probe_torch_ops(mod, torch):
    """The ops a one-token append and a decode step run, watched with the kit's op recorder (``op_watch``).

    Returns ``{"append_ops", "attention_ops"}`` as ``[op packet, elements returned, is a view]`` lists, and
    whether the K/V buffers kept their objects and storage.
    """
    OpWatch = op_watch()

    def listed(watch):
        return [[op.packet.split(".")[-1], int(op.numel), bool(op.aliases)] for op in watch.ops]

    B, Hkv, G, S, d = 2, 2, 4, 256, 32
    cache = mod.KVCache(B, Hkv, S, d, dtype=torch.float32)
    k0, v0 = cache.k, cache.v
    ptr = (k0.data_ptr(), v0.data_ptr())
    kv = torch.randn(B, Hkv, S - 1, d)
    cache.append(kv, kv, torch.full((B,), S - 1))
    one = torch.randn(B, Hkv, 1, d)
    with OpWatch() as append_ops:
        cache.append(one, one, torch.ones(B, dtype=torch.int64))
    q = torch.randn(B, Hkv * G, 1, d)
    with OpWatch() as attention_ops:
        mod.gqa_attention(q, cache, torch.ones(B, dtype=torch.int64))
    return {"append_ops": listed(append_ops), "attention_ops": listed(attention_ops),
            "same_objects": cache.k is k0 and cache.v is v0,
            "same_storage": (cache.k.data_ptr(), cache.v.data_ptr()) == ptr,
            "live_k_numel": B * Hkv * S * d, "buffer_numel": int(k0.numel()), "G": G}




def judge_in_place(probe, label: str = "append") -> Criterion:
    """Buffer identity and bytes allocated per one-token append; identity in every hidden trial too."""
    if not isinstance(probe, dict) or "error" in probe:
        return _error("preallocated_in_place", probe)
    allocs = probe.get("allocs") or []
    # growth_held's fraction, taken here of the live K and V together (a copy of both per append is 1) where
    # the table takes it of live K alone: tracemalloc sees one append's K and V allocations as one figure.
    grown = [a for a in allocs if a[1] >= BOUNDS["growth_held"].limit * a[2]]
    figures = ", ".join(f"{a[1]:,} B at {a[0]:,} tokens" for a in allocs)
    if not probe.get("same_objects") or grown:
        why = "K/V buffers replaced by new objects" if not probe.get("same_objects") else \
            "a one-token append allocates memory that grows with the cache"
        return Criterion("preallocated_in_place", "fail", f"{why} ({figures} allocated per {label})",
                         mistakes=["concat_growth"])
    return Criterion("preallocated_in_place", "pass",
                     f"buffers are the same objects after every append; one-token append allocates {figures}")


def judge_repeat(probe) -> Criterion:
    if not isinstance(probe, dict) or "error" in probe:
        return _error("no_kv_repeat", probe)
    peak, live, G = probe["peak_bytes"], probe["live_kv_bytes"], probe["G"]
    ratio = peak / live
    if peak >= repeat_peak_limit(G) * live:  # live: K and V together, the table's unit
        return Criterion("no_kv_repeat", "fail", f"decode at G = {G} allocates {ratio:.1f}x the live K/V "
                         f"({peak:,} B against {live:,} B): K/V materialised per query head",
                         mistakes=["kv_repeat"])
    return Criterion("no_kv_repeat", "pass", f"decode at G = {G} allocates {ratio:.2f}x the live K/V "
                     f"({peak:,} B; a repeat would be {G}x)")


def judge_torch_ops(ops: dict) -> dict:
    """``{mistake: evidence}`` from the ops a port ran (``probe_torch_ops``).

    ``concat_growth``: append runs a ``cat``/``stack`` whose output is at least half the K
    buffer (a cat of a mask or of the new tokens is not growth of the cache), or the buffers move.
    ``kv_repeat``: attention runs a non-view op whose output has at least G times
    the live K elements, or a ``repeat``/``repeat_interleave`` as large as K.
    Views (``alias_info`` in the op's schema) cost nothing and are ignored.
    """
    named = {}
    buffer = ops.get("buffer_numel") or ops["live_k_numel"]
    grew = [op for op in ops.get("append_ops", []) if op[0] in ("cat", "stack") and op[1] >= buffer / 2]
    if grew:
        named["concat_growth"] = (f"append runs aten.{grew[0][0]} with an output of {grew[0][1]:,} elements: "
                                  f"a new K/V buffer (the K buffer holds {buffer:,})")
    elif not ops.get("same_storage"):
        named["concat_growth"] = "append writes into new storage: the K/V buffers moved"
    big, live = ops["G"] * ops["live_k_numel"], ops["live_k_numel"]
    copies = [op for op in ops.get("attention_ops", [])
              if not op[2] and (op[1] >= big or (op[0] in ("repeat_interleave", "repeat") and op[1] >= live))]
    if ops["G"] > 1 and copies:
        named["kv_repeat"] = (f"attention runs aten.{copies[0][0]} with an output of {copies[0][1]:,} elements "
                              f"(live K: {live:,}, G = {ops['G']})")
    return named


