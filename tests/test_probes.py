"""The structural probes and the criteria they decide, from the kernel's figures of each part of a run.

Unit tests: the figures are given (as ``grader.sandbox.launch`` records them between a task's marks), the
probes and their expected outputs are the real ones of a seed, and each test says which pattern a figure
shows. End-to-end runs of the examples are in tests/test_grader.py and tests/test_bounds.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from catalogue import rules as bounds
from grader.stages import criteria, jobs, probes
from grader.sandbox.launch import TaskResult

MIB = 2**20
SEED = 11
COPY_S = 0.004  # seconds to copy the growth probe's K/V at its end, as the parent would time it


@pytest.fixture(scope="module")
def built():
    flat, memo = jobs.Flat(), {}
    plan = probes.probes(SEED)
    return plan, {p.name: probes.build(p, flat, memo) for p in plan}


def _task(name, built_probe, parts, memory_source="cgroup"):
    """A task whose marks recorded ``parts``: ``[(cpu_s, peak, start, end)]`` per part (MiB for memory),
    the first part being the one after the import; its answer is the expected outputs."""
    points, cpu = [], 0.0
    first = parts[0]
    points.append({"cpu_s": 0.0, "usage": first[2] * MIB, "peak": first[2] * MIB})
    for part_cpu, peak, start, end in parts:
        cpu += part_cpu
        points.append({"cpu_s": cpu, "usage": end * MIB, "peak": peak * MIB})
    points.append({"cpu_s": cpu + 0.01, "usage": 0, "peak": parts[-1][3] * MIB})  # the answer, then the end
    sent = [np.asarray(built_probe.expect[i], dtype="<f8").tobytes() if i in built_probe.expect else b""
            for i in range(len(points) - 1)]
    return TaskResult(name=name, answer={"records": [[]]}, exit=0, cpu_s=cpu, sent=sent,
                      memory_bytes=int(max(p[1] for p in parts) * MIB), memory_source=memory_source, points=points)


def _memory_parts(live_mib: float, decode=0.2, chunk=0.3, held=0.0):
    """The four parts of a memory probe (after the import): making the row and its decode append, the
    decode's attention, the chunk's append, the chunk's attention (``held``: kept from the making on)."""
    row = 20 + held  # a repeat made at the prefill and kept
    return [(0.05, row + 3 * live_mib, 20, row + 3 * live_mib),
            (0.01, row + 3 * live_mib + decode, row + 3 * live_mib, row + 3 * live_mib),
            (0.001, row + 3 * live_mib, row + 3 * live_mib, row + 3 * live_mib),
            (0.01, row + 3 * live_mib + chunk, row + 3 * live_mib, row + 3 * live_mib)]


def _memory_runs(built, extra=None):
    """Every memory probe of the seed, honest unless ``extra[name]`` gives its parts' keyword figures
    (in live K/V of its calls)."""
    plan, made = built
    runs = []
    for p in plan:
        if p.purpose != "memory":
            continue
        live = p.live_bytes / MIB
        given = {k: v * live for k, v in (extra or {}).get(p.name, {}).items()}
        runs.append((p, _task(p.name, made[p.name], _memory_parts(live, **given)), made[p.name]))
    return runs


def _layout_names(built):
    return [p.name for p in built[0] if p.purpose == "memory" and not p.twin_of]


# ---------------------------------------------------------------- the plan

def test_layouts_are_drawn_per_seed_from_real_checkpoints():
    """Each seed draws three memory layouts of three KV-head counts, each beside a twin at G = 1 with the
    same cache; over a few seeds every KV-head count, both head sizes and both dtypes come up, and the
    reservations differ: no test on the shapes picks out a measured call."""
    seen = {"Hkv": set(), "d": set(), "dtype": set(), "max_len": set()}
    real = {(hq, hkv, d) for _, hq, hkv, d in probes.CHECKPOINTS}
    for seed in range(8):
        plan = probes.probes(seed)
        memory = [p for p in plan if p.purpose == "memory"]
        layouts = [p for p in memory if not p.twin_of]
        assert len(layouts) == 3 and len({p.config["Hkv"] for p in layouts}) == 3
        assert {p.config["dtype"] for p in layouts} == set(probes.DTYPES) and 64 in {p.config["d"] for p in layouts}
        for p in plan:
            c = p.config
            if not p.twin_of and p.purpose != "grow":  # the appends' closing decode is at G = 1
                assert (c["Hkv"] * c["G"], c["Hkv"], c["d"]) in real, c
            if p.purpose == "grow":
                assert any((hkv, d) == (c["Hkv"], c["d"]) for _, _, hkv, d in probes.CHECKPOINTS), c
            for key in seen:
                seen[key].add(c[key])
        for twin in (p for p in memory if p.twin_of):
            layout = next(p for p in memory if p.name == twin.twin_of)
            assert twin.config["G"] == 1 and all(twin.config[k] == layout.config[k]
                                                 for k in ("Hkv", "d", "dtype", "live", "max_len", "seed"))
    assert seen["Hkv"] == {1, 2, 4, 8} and seen["d"] == {64, 128} and seen["dtype"] == {"float32", "float64"}
    assert len(seen["max_len"]) > 20


def test_what_was_drawn_is_recorded():
    drawn = probes.describe(probes.probes(3))
    assert {d["purpose"] for d in drawn} == {"memory", "grow", "scan"}
    assert all({"layout", "Hq", "Hkv", "d", "dtype", "max_len"} <= set(d) for d in drawn)


def test_the_reference_applies_the_bottom_right_mask_and_the_head_map():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 2, 8)), rng.standard_normal((1, 2, 5, 8)), rng.standard_normal((1, 2, 5, 8))
    out = probes.reference(q, k, v)
    # Query head 3 reads KV head 1; the chunk's first query (position 3) sees keys 0..3 only.
    s = q[0, 3, 0] @ k[0, 1, :4].T / np.sqrt(8)
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert np.allclose(out[0, 3, 0], w @ v[0, 1, :4])


def test_every_measured_query_is_handed_over_at_its_mark(built):
    """No probe's job spec holds a measured query or the order of the appended tokens: each lies in the
    marks the parent keeps, and every measured call's output is due at the mark after it."""
    plan, made = built
    for p in plan:
        steps = [s for t in made[p.name].trials for s in t["steps"]]
        attended = [s for s in steps if s.get("attend") is not False]
        assert attended and all(s["q"] == "go" for s in attended), p.name
        assert len(made[p.name].marks) == sum(bool(s.get("mark")) + bool(s.get("mark_after")) for s in steps)
        assert max(made[p.name].expect) == len(made[p.name].marks) + 1  # the last output leaves at the last mark
        if p.purpose == "grow":
            assert all("pick" in s for s in steps[1:-1]) and steps[0]["given"] == [["perm", [len(steps) - 2]]]


# ---------------------------------------------------------------- repeat

def test_honest_calls_pass(built):
    crit = criteria.no_repeat(_memory_runs(built))
    assert crit.status == "pass" and not crit.mistakes, crit.evidence


@pytest.mark.parametrize("call", ["decode", "chunk"])
def test_a_repeat_in_any_one_path_is_named(built, call):
    """A repeat at decode only, or in the prompt path only (T > 1 after cached tokens)."""
    layout = _layout_names(built)[0]
    G = next(p for p in built[0] if p.name == layout).config["G"]
    crit = criteria.no_repeat(_memory_runs(built, {layout: {call: float(G)}}))
    assert crit.status == "fail" and crit.mistakes == ["kv_repeat"], crit.evidence


def test_half_a_repeat_is_named(built):
    """K repeated, V read in place: (G - 1) / 2 of the live K/V above the twin."""
    layout = _layout_names(built)[1]
    G = next(p for p in built[0] if p.name == layout).config["G"]
    crit = criteria.no_repeat(_memory_runs(built, {layout: {"decode": 0.2 + (G - 1) / 2}}))
    assert crit.mistakes == ["kv_repeat"], crit.evidence


def test_a_repeat_made_before_the_call_and_held_is_named(built):
    """Work moved before the call's mark (a repeat of the prefilled K/V, kept) shows in the process's peak."""
    layout = _layout_names(built)[2]
    G = next(p for p in built[0] if p.name == layout).config["G"]
    crit = criteria.no_repeat(_memory_runs(built, {layout: {"held": float(G)}}))
    assert crit.mistakes == ["kv_repeat"], crit.evidence


def test_memory_per_query_head_beside_a_padded_twin_fails_unnamed(built):
    """A call that adds G times its K/V while its twin is padded to match cancels in the difference; its own
    figure still fails the criterion, without a name (no pattern)."""
    plan, _ = built
    extra = {}
    for p in plan:
        if p.purpose == "memory":
            G = (next(q for q in plan if q.name == p.twin_of) if p.twin_of else p).config["G"]
            extra[p.name] = {"decode": float(G)}
    crit = criteria.no_repeat(_memory_runs(built, extra))
    assert crit.status == "fail" and not crit.mistakes and "whatever the heads" in crit.evidence, crit.evidence


def test_honest_working_copies_are_not_memory_per_head(built):
    """K and V upcast to float64 with a contiguous K^T: about 3x the K/V a call reads, at layout and twin."""
    extra = {p.name: {"decode": 3.0, "chunk": 3.2} for p in built[0] if p.purpose == "memory"}
    crit = criteria.no_repeat(_memory_runs(built, extra))
    assert crit.status == "pass", crit.evidence


def test_marks_that_do_not_follow_the_calls_void_the_figure(built):
    runs = _memory_runs(built)
    probe, task, made = runs[0]
    task.points = task.points[:2] + task.points[3:]  # one mark short: the parts cannot be told apart
    crit = criteria.no_repeat(runs)
    assert crit.status == "error" and "marks did not follow" in crit.evidence, crit.evidence


def test_a_wrong_output_at_the_probe_voids_the_figure(built):
    runs = _memory_runs(built)
    probe, task, made = runs[1]
    task.sent = [np.zeros(len(b) // 8).tobytes() for b in task.sent]
    crit = criteria.no_repeat(runs)
    assert crit.status == "error" and "does not match" in crit.evidence, crit.evidence


# ---------------------------------------------------------------- growth

def _grow(built, held=0.0, copies=0.0, copy_at=None, stopped=False):
    plan, made = built
    probe = next(p for p in plan if p.purpose == "grow")
    c = probe.config
    per_token = probe.live_bytes / c["total"] / MIB
    parts, used = [(0.05, 20 + c["prefill"] * per_token, 20, 20 + c["prefill"] * per_token)], 20 + c["prefill"] * per_token
    start = c["prefill"]
    j = 0
    while start < c["total"]:
        count = min(c["every"], c["total"] - start)
        end = used + count * per_token
        peak = end + (held * start * per_token if copy_at == j else 0.0)
        # An append in place: 20 us; ``copies`` copies of the cache it holds on every append besides.
        cpu = count * (2e-5 + copies * COPY_S * start / c["total"])
        parts.append((cpu, peak, used, end))
        used, start, j = end, start + count, j + 1
    parts.append((0.002, used + 2 * probe.live_bytes / MIB, used, used))  # the closing decode's own memory
    task = _task("grow", made["grow"], parts)
    if stopped:
        task.points = task.points[:-2] + [task.points[-1]]  # no last mark: the run was stopped
        task.stopped, task.answer, task.exit = "timeout", None, None
    return [(probe, task, made["grow"])]


def test_appends_in_place_pass(built):
    crit = criteria.in_place(copy_s=COPY_S, runs=_grow(built))
    assert crit.status == "pass" and not crit.mistakes, crit.evidence


@pytest.mark.parametrize("part", [0, 5, 15])
def test_one_reallocation_in_any_part_is_named(built, part):
    """A doubling cache copies once per doubling: the part it happens in peaks the old buffer above its end."""
    crit = criteria.in_place(copy_s=COPY_S, runs=_grow(built, held=1.0, copy_at=part))
    assert crit.status == "fail" and crit.mistakes == ["concat_growth"], crit.evidence


def test_appends_that_cost_a_copy_of_the_cache_are_named(built):
    """A copy on every append, made where no memory figure sees it (another process, pages written before):
    its CPU time, a copy of the cache per append, names it."""
    crit = criteria.in_place(copy_s=COPY_S, runs=_grow(built, copies=1.0))
    assert crit.mistakes == ["concat_growth"], crit.evidence


def test_appends_stopped_for_their_time_are_judged_by_the_parts_that_finished(built):
    crit = criteria.in_place(copy_s=COPY_S, runs=_grow(built, held=1.0, copy_at=3, stopped=True))
    assert crit.mistakes == ["concat_growth"], crit.evidence
    crit = criteria.in_place(copy_s=COPY_S, runs=_grow(built, stopped=True))
    assert crit.status == "error" and not crit.mistakes, crit.evidence


# ---------------------------------------------------------------- live length

def _scan(built, small_cpu, large_cpu):
    plan, made = built
    runs = {"small": [], "large": []}
    for p in plan:
        if p.purpose == "scan":
            cpu = (small_cpu if p.config["reservation"] == "small" else large_cpu)[p.config["run"] - 1]
            # Making a large reservation (a mask table of max_len^2 entries) costs seconds; it is not a part.
            making = 3.0 if p.config["reservation"] == "large" else 0.05
            parts = [(making, 60, 20, 50), (0.002, 51, 50, 50), (cpu, 51, 50, 50)]
            runs[p.config["reservation"]].append((p, _task(p.name, made[p.name], parts), made[p.name]))
    return runs["small"], runs["large"]


@pytest.mark.parametrize("large,status", [((0.11, 0.10), "pass"), ((0.6, 0.55), "fail"), ((0.35, 0.08), "pass")])
def test_the_decode_steps_alone_decide_the_live_length(built, large, status):
    """Making the cache (3 s more in the larger reservation here) is outside the figure; a scan is named by
    the steps; one dear run (load) beside a cheap one names nothing."""
    crit = criteria.live_length(*_scan(built, (0.1, 0.12), large))
    assert crit.status == status and crit.mistakes == (["max_len_scan"] if status == "fail" else []), crit.evidence


def test_a_scan_is_not_named_when_the_appends_copy(built):
    crit = criteria.live_length(*_scan(built, (0.1, 0.1), (0.6, 0.6)), appends_copy=True)
    assert crit.status == "error" and not crit.mistakes, crit.evidence


def test_every_bound_has_a_rule_and_a_margin_above_one():
    for bound in bounds.BOUNDS.values():
        assert bound.rule and bound.margin > 1 and bound.limit > 0
    assert bounds.call_held_limit(16) > bounds.call_held_limit(2) >= bounds.BOUNDS["call_held"].limit


def test_the_copy_unit_is_a_copy_from_main_memory_whatever_the_probes_size():
    """The growth CPU figure's unit scales with the bytes: a small probe's cache would fit in the processor's
    cache and copy two to three times faster, and a constant per-append overhead would read as a fraction of
    a copy that grows as the probe shrinks."""
    from grader.stages import run

    small, large = run.copy_seconds(4 * MIB), run.copy_seconds(64 * MIB)
    assert small > 0 and large == pytest.approx(16 * small)
    assert run.COPY_SAMPLE >= 64 * MIB  # twice the last-level cache (32 MiB on the CI machine's EPYC)
