"""From measurements to criteria: each rubric criterion's status, evidence and mistakes.

Every function here reads data the parent already holds (step verdicts from
``compare``, the kernel's figures of each probe's parts, taken between its
marks by ``grader.sandbox.launch``) and decides one criterion. Nothing is
guessed from source. The bounds are ratios, each defined once in
``catalogue.rules``; how they were measured is docs/measurement.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from catalogue.rules import BOUNDS, call_held_limit, task_held_limit
from grader.stages.compare import Comparison, StepVerdict, first_failure
from grader.stages.verdicts import Status

CHARGE_SLACK = 256 * 2**10  # bytes: the memory a cgroup is charged ahead of use (64 pages, MEMCG_CHARGE_BATCH)
PROBE_TOLERANCE = 1e-4  # float32 probe outputs against the float64 computation


@dataclass
class Criterion:
    """One rubric line: ``status`` is a :class:`~grader.stages.verdicts.Status` (pass, fail, not_attempted or error)."""

    id: str
    status: Status
    evidence: str
    mistakes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    caps: str = ""  # the port only: why it caps the tier though no mistake is named (it could not be measured)
    silent: bool = False  # some step returned a wrong output (rather than raising): silently wrong
    unjudgeable: bool = False  # error: the code ran and measured, but no figure can tell (not the port's fault)
    figures: dict = field(default_factory=dict)  # the measured ratios it was judged by, by bound (catalogue.rules.BOUNDS)


def _where(step: StepVerdict) -> str:
    """A failing step's configuration, in words, with no hidden value."""
    return f"step {step.index + 1} of trial '{step.trial.name}' ({step.trial.describe()})"


def refused_clearly(step: StepVerdict) -> bool:
    """Whether ``step`` raised a clear error (ValueError, TypeError or NotImplementedError): a refusal."""
    return step.status == "raised" and bool(step.error and step.error.get("value_error")) \
        or (step.status == "raised" and (step.error or {}).get("type") == "NotImplementedError")


def correctness(cid: str, steps: list[StepVerdict], what: str, refusable: list[StepVerdict] | None = None) -> Criterion:
    """pass when every step in ``steps`` matches the oracle on its real query slots.

    Steps never run (an earlier append of their trial failed) are no evidence
    either way and are left out; the failed append is itself a failing step.
    ``refusable``: the calls a submission may refuse as a whole (T > 1 after
    cached tokens, ragged ones included). The criterion is ``not_attempted``
    (a refusal, not a failure) only when every one of them that ran was refused
    with a clear error; otherwise the wrong answers stand.
    """
    steps = [s for s in steps if s.status != "not_run"]
    if not steps:
        return Criterion(cid, Status.ERROR, f"no {what} step was run")
    bad = first_failure(steps)
    if bad is None:
        worst = max(s.max_error for s in steps)
        return Criterion(cid, Status.PASS,
                         f"{len(steps)} {what} steps match the direct reference (max error {worst:.1e})")
    failing = [s for s in steps if s.status != "ok"]
    ran = [s for s in refusable or [] if s.status != "not_run"]
    if refusable is not None and ran and all(refused_clearly(s) for s in failing) and all(refused_clearly(s) for s in ran):
        # Charged once: the other checks are judged on the calls the refusal does not touch.
        return Criterion(cid, Status.NOT_ATTEMPTED,
                         f"{what} refused with a clear error, charged here only ({bad.error.get('type')}: "
                         f"{bad.error.get('message')}); the other checks are judged on the calls it does not touch")
    how = {"wrong": f"wrong output (max error {bad.max_error:.1e})", "raised": bad.detail,
           "bad_output": bad.detail, "not_run": bad.detail}[bad.status]
    return Criterion(cid, Status.FAIL, f"{len(failing)} of {len(steps)} {what} steps fail; first: {_where(bad)}: {how}",
                     silent=any(s.status == "wrong" or s.returned_bad for s in failing))


def heads_read(step: StepVerdict, out) -> list[list]:
    """For a one-token-per-row step: per row, the KV head whose value each query head returned (None: no head's).

    With one key visible, softmax gives it weight 1 whatever the mask or the
    scale, so the output of head h is exactly the value of the KV head it reads.
    """
    v = step.trial.steps[step.index].v_new  # [B, Hkv, 1, d]
    tol = 1e-6 if step.trial.dtype == "float64" else 1e-3
    rows = []
    for b in range(step.trial.B):
        rows.append([next((kv for kv in range(step.trial.Hkv)
                           if np.allclose(out[b, h, 0], v[b, kv, 0], rtol=tol, atol=tol)), None)
                     for h in range(step.trial.Hq)])
    return rows


def head_mapping(comparison: Comparison, outputs_by_trial: dict | None = None) -> Criterion:
    """Single-token rows in real checkpoint layouts: the output of head h is v of the KV head it reads.

    Fails when some query head returns another KV head's value. When outputs
    are wrong but are no KV head's value at all, the mapping cannot be told
    from them: the criterion errors, saying so, and the output checks fail.
    """
    steps = comparison.in_trials("head-map-")
    result = correctness("head_mapping", steps, "single-token head-layout")
    layouts = "Hq/Hkv = " + ", ".join(f"{s.trial.Hq}/{s.trial.Hkv}" for s in steps)
    if result.status == Status.PASS:
        result.evidence = f"one-token rows in layouts {layouts}: query head h returns v of KV head h // G"
        return result
    if outputs_by_trial is None or result.status != Status.FAIL:
        return result
    misread, unknown = [], []
    for s in steps:
        out = (outputs_by_trial.get(s.trial.name) or [None])[s.index]
        if s.status != "wrong" or out is None:
            continue
        for b, row in enumerate(heads_read(s, out)):
            for h, kv in enumerate(row):
                if kv is None:
                    unknown.append((s, h))
                elif kv != h // s.trial.G:
                    misread.append((s, h, kv))
    if misread:
        s, h, kv = misread[0]
        result.evidence = (f"query head {h} returns v of KV head {kv}, not {h} // G = {h // s.trial.G}, "
                           f"in {len({m[0].trial.name for m in misread})} layouts; first: {_where(s)}")
    elif unknown:
        result = Criterion("head_mapping", Status.ERROR,
                           f"could not be told: one-token rows return no KV head's value (first: "
                           f"{_where(unknown[0][0])}); the outputs are wrong for another reason")
    return result


def padding(comparison: Comparison) -> Criterion:
    """Padded slots and zero-token rows: finite required, exactly 0 asked for."""
    padded = [s for s in comparison.steps if s.padding != "none"]
    if not padded:
        return Criterion("padding", Status.ERROR, "no step with padded slots returned an output")
    nonfinite = [s for s in padded if s.padding == "nonfinite"]
    if nonfinite:
        smallest = min(nonfinite, key=lambda s: (s.trial.size, s.index))
        return Criterion("padding", Status.FAIL, f"{len(nonfinite)} of {len(padded)} steps with padded slots or "
                         f"zero-token rows return NaN or inf there; smallest: {_where(smallest)}",
                         mistakes=["nan_padding"])
    result = Criterion("padding", Status.PASS, f"{len(padded)} steps with padded slots or zero-token rows: all finite")
    finite = [s for s in padded if s.padding == "finite"]
    if finite:
        result.notes.append(f"padded slots are finite but not exactly 0 in {len(finite)} steps "
                            f"(the contract asks for 0)")
    else:
        result.evidence += " and exactly 0"
    return result


def edge_cases(comparison: Comparison) -> list[str]:
    """Notes on B = 0, the all-empty cache and T = 0 (zeros of shape [B, Hq, T, d])."""
    notes = []
    for prefix, label in (("empty-batch", "B = 0"), ("all-empty-cache", "an all-empty cache"), ("no-slots", "T = 0")):
        bad = first_failure([s for s in comparison.in_trials(prefix) if s.kind == "edge"])
        if bad is not None:
            notes.append(f"{label}: {bad.detail or 'wrong output'}")
    return notes


def dtype_notes(comparison: Comparison) -> list[str]:
    wrong = [s for s in comparison.steps if s.status in ("ok", "wrong") and not s.dtype_ok]
    return [f"output dtype differs from q's in {len(wrong)} steps (the contract: q's dtype)"] if wrong else []


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _refusal(record) -> bool:
    err = record.get("error") or {} if isinstance(record, dict) else {}
    return bool(err.get("value_error")) or err.get("type") == "NotImplementedError"


def refused_steps(task) -> set:
    """``(trial, step)`` of a probe's calls that raised a clear error (ValueError, TypeError or
    NotImplementedError): a refusal of that kind of call, or the steps after it in its trial (never run)."""
    answer = task.answer if task is not None and isinstance(task.answer, dict) else {}
    out = set()
    for t, records in enumerate(answer.get("records") or []):
        if not isinstance(records, list):
            continue
        for s, record in enumerate(records):
            if isinstance(record, dict) and record.get("error") and _refusal(record):
                out.update((t, i) for i in range(s, s + 64))
    return out


def probe_failure(task, built, check_output: bool = True, refused: bool = False) -> str:
    """Why a probe task gives no figure to decide on ("" when it ran, made every mark its calls call for,
    and its outputs are right).

    ``built`` is the probe's ``grader.stages.probes.Built`` (its marks and expected outputs). ``check_output`` is
    off when decode is wrong on the hidden trials too: a wrong probe output is then that same mistake, not
    a "measurement mode", and the figure stands. The stored keys of an append-only probe are always checked.
    ``refused``: the submission refuses chunked prefill with a clear error, so a probe's call of that kind
    may raise too; the other calls still count (the refusal is charged once, in its own criterion). The
    outputs checked are those the task sent with its marks, each right after its calls (``Built.expect``).
    """
    if task is None:
        return "the probe did not run (the session ended before it)"
    why = task.why()
    if why:
        return why
    answer = task.answer or {}
    if "error" in answer:
        err = answer["error"] if isinstance(answer["error"], dict) else {}
        return f"raised {err.get('type')}: {err.get('message')}"
    if answer.get("import"):
        err = answer["import"] if isinstance(answer["import"], dict) else {}
        return f"failed to import: {err.get('type')}: {err.get('message')}"
    records = [r for trial in answer.get("records") or [] if isinstance(trial, list) for r in trial] \
        if isinstance(answer.get("records"), list) else []
    failed = next((r for r in records if isinstance(r, dict) and r.get("stage") in ("init", "append", "attention")
                   and not (refused and r.get("stage") != "init" and _refusal(r))), None)
    if failed is not None:
        err = failed.get("error") or {}
        return f"raised {err.get('type')} in {failed.get('stage')}: {err.get('message')}"
    if len(task.points) != len(built.marks) + 3:  # after the import, the trials' own, after the calls, the end
        return (f"its measurement marks did not follow its calls ({max(len(task.points) - 1, 0)} marks where "
                f"{len(built.marks) + 2} were due)")
    if not check_output:
        return ""
    for index, want in built.expect.items():
        sent = task.sent[index] if index < len(task.sent) else b""
        if refused and not sent:
            continue  # a refused call sends no output: the refusal is charged in its own criterion
        got = np.frombuffer(sent, dtype="<f8") if len(sent) % 8 == 0 else np.zeros(0)
        if got.size != np.asarray(want).size:
            return f"sent {got.size} output values at a mark where {np.asarray(want).size} were due"
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        if not np.isfinite(err) or err > PROBE_TOLERANCE:
            return f"its output at this size does not match the reference (max error {err:.1e})"
    return ""


def _layout(config: dict) -> str:
    return (f"Hq/Hkv = {config['Hkv'] * config['G']}/{config['Hkv']}, d = {config['d']}, {config['dtype']}"
            + (f" ({config['layout']})" if config.get("layout") else ""))


# The attention calls of a memory probe, by the index of the part (between two marks) each is alone in, and
# by (trial, step) in its records. Parts 2 to 5 are the long row's: its making, prefill and calls.
MEMORY_CALLS = {"decode": 1, "chunked prefill": 3}
MEMORY_STEPS = {"decode": (0, 1), "chunked prefill": (0, 2)}
ROW_PARTS = (0, 1, 2, 3)


def _call_live(config: dict, call: str) -> int:
    """The K/V bytes an attention call of a memory probe reads."""
    item = 8 if config["dtype"] == "float64" else 4
    tokens = config["live"] + (config["chunk"] if call == "chunked prefill" else 0)
    return 2 * config["Hkv"] * tokens * config["d"] * item


def _call_extra(task, call: str):
    """What one attention call added to the memory in use when it began (bytes), or None where unknown
    (no figure per part, or the call was refused)."""
    parts = task.segments()
    part = parts[MEMORY_CALLS[call]] if len(parts) > MEMORY_CALLS[call] else None
    if part is None or part["peak"] is None or part["start"] is None or MEMORY_STEPS[call] in refused_steps(task):
        return None
    return max(part["peak"] - part["start"], 0)


def _held(probe, task) -> int:
    """What the long row's process holds at its peak, from its making on (its cache, what the cache builds,
    its calls' working memory), above what it held before: bytes. Without figures per part, the process's
    peak from its import on (a peak-RSS figure also counts the mapped inputs of the row)."""
    parts = task.segments()
    if len(parts) > max(ROW_PARTS) and all(parts[i]["peak"] is not None for i in ROW_PARTS) \
            and parts[ROW_PARTS[0]]["start"] is not None:
        return max(parts[i]["peak"] for i in ROW_PARTS) - parts[ROW_PARTS[0]]["start"]
    return task.memory_bytes - (probe.input_bytes if task.memory_source == "rss" else 0)


def no_repeat(runs: list, check_output: bool = True, refused: bool = False) -> Criterion:
    """Decode and chunked-prefill attention at drawn real layouts, each beside its twin at G = 1.

    ``runs`` holds ``(probe, task, built)`` per memory probe (``grader.stages.probes``). Each attention call is a
    part of its own between two marks, so what it adds to the memory in use is the kernel's figure of that
    call alone: a K/V repeat adds about G times the K/V it reads at the layout and once or not at all at the
    twin (``repeat_per_head``), wherever it is written (NumPy, torch, mmap, shared memory) and in whichever
    path makes it. A call that holds memory per query head whatever its twin holds fails without a name
    (``call_held``); so does a whole decode process at 8 KV heads and d = 128 (``task_held``), where a
    mask table of ``max_len``^2 entries is small beside the K/V.
    """
    cid = "no_kv_repeat"
    by_name = {p.name: (p, t, b) for p, t, b in runs}
    pairs = [(by_name.get(p.twin_of), by_name[p.name]) for p, _, _ in runs if p.twin_of]
    if not pairs:
        return Criterion(cid, Status.ERROR, "no memory probe was planned")
    for run, twin_run in pairs:
        if run is None:
            return Criterion(cid, Status.ERROR, "a memory probe's twin at G = 1 has no layout beside it")
        for probe, task, built in (run, twin_run):
            why = probe_failure(task, built, check_output, refused)
            if why:
                return Criterion(cid, Status.ERROR, f"the memory probe at {_layout(probe.config)}: {why}")
    per_head = BOUNDS["repeat_per_head"]
    figures, named, unheld = [], [], []
    worst = {"repeat_per_head": float("-inf"), "call_held": float("-inf"), "task_held": float("-inf")}
    meter = "the sandbox's cgroup" if runs[0][1].memory_source == "cgroup" else "the process's peak RSS"
    for (probe, task, _), (twin, twin_task, _) in pairs:
        G, c = probe.config["G"], probe.config
        shown = []
        for call in MEMORY_CALLS:
            mine, theirs = _call_extra(task, call), _call_extra(twin_task, call)
            if mine is None or theirs is None:
                continue
            live = _call_live(c, call)
            ratio = (mine - theirs) / (live * (G - 1))
            worst["repeat_per_head"] = max(worst["repeat_per_head"], ratio)
            worst["call_held"] = max(worst["call_held"], mine / live / call_held_limit(G) * BOUNDS["call_held"].limit)
            shown.append(f"{call} +{mine / live:.1f}x (twin +{theirs / live:.1f}x)")
            if per_head.crossed(ratio):
                named.append((ratio, f"{call} at {_layout(c)} adds {mine / live:.1f}x the K/V it reads "
                                     f"({_mib(live)}), its twin at G = 1 {theirs / live:.1f}x: {mine / live - theirs / live:.1f}x "
                                     f"more for {G - 1} more query heads per KV head, about one copy of the K/V each "
                                     f"({ratio:.2f})"))
            elif mine / live >= call_held_limit(G):
                unheld.append(f"{call} at {_layout(c)} adds {mine / live:.1f}x the K/V it reads, "
                              f"{call_held_limit(G):.1f}x or more, and its twin at G = 1 about as much")
        shown += [f"{call} refused" for call in MEMORY_CALLS if MEMORY_STEPS[call] in refused_steps(task)]
        whole = (_held(probe, task) - _held(twin, twin_task)) / (probe.live_bytes * (G - 1))
        worst["repeat_per_head"] = max(worst["repeat_per_head"], whole)
        if per_head.crossed(whole):
            named.append((whole, f"the decode process at {_layout(c)} peaks {_held(probe, task) / probe.live_bytes:.1f}x "
                                 f"the live K/V, its twin {_held(twin, twin_task) / twin.live_bytes:.1f}x: memory per "
                                 f"query head held across the calls"))
        total = _held(probe, task) / probe.live_bytes
        if c["Hkv"] == 8 and c["d"] == 128:
            worst["task_held"] = max(worst["task_held"], total / task_held_limit(G) * BOUNDS["task_held"].limit)
        if c["Hkv"] == 8 and c["d"] == 128 and total >= task_held_limit(G):
            unheld.append(f"the decode process at {_layout(c)} holds {total:.1f}x the live K/V, "
                          f"{task_held_limit(G):.1f}x or more, and its twin about as much")
        figures.append(f"{_layout(c)}: " + ", ".join(shown or ["no figure per call"]))
    text = "; ".join(figures)
    measured = {k: round(v, 3) for k, v in worst.items() if v != float("-inf")}
    if named:
        return Criterion(cid, Status.FAIL, f"{max(named)[1]} ({meter}): K/V materialised per query head. Each call's "
                         f"extra memory, in the K/V it reads: {text}", mistakes=["kv_repeat"], figures=measured)
    if unheld:
        return Criterion(cid, Status.FAIL, f"{unheld[0]} ({meter}): memory per query head, or half of it at once, "
                         f"whatever the heads (a call that reads in place adds its scores and at most working "
                         f"copies of K and V). Each call's extra memory: {text}", figures=measured)
    return Criterion(cid, Status.PASS, f"decode and chunked prefill measured by {meter}, each call "
                     f"against its twin at G = 1, in the K/V it reads: {text} (a repeat would add about G times)",
                     figures=measured)


def in_place(runs: list, explain: list | None = None, check_output: bool = True, copy_s: float = 0.0) -> Criterion:
    """One-token appends from a prefill of half the tokens to the end, a mark every 1/32 of them: the kernel's figures.

    ``runs`` is ``[(probe, task, built)]`` for the growth probe (``grader.stages.probes``). Written in place, the
    memory in use only grows as pages are first written, and each append costs the same whatever the
    length. Reallocated and copied (by concatenation, in steps, or by doubling), a part holds the old buffer
    beside its copy and ends below its peak (``growth_held``), and a copy on every append costs in
    proportion to the length (``growth_cpu``, in copies of the cache per append; ``copy_s`` is the CPU time the
    parent takes to copy the probe's K/V at its end once). ``explain`` adds what in-process meters saw (buffer identity),
    as explanation only. ``check_output`` is off when decode is wrong on the hidden trials too: the closing
    decode's wrong output is then that mistake, and the figures stand.
    """
    cid = "preallocated_in_place"
    if len(runs) != 1:
        return Criterion(cid, Status.ERROR, "the growth probe was not planned")
    probe, task, built = runs[0]
    c = probe.config
    why = probe_failure(task, built, check_output)
    stopped = task is not None and task.stopped == "timeout" and len(task.points) > 2
    if why and not stopped:
        return Criterion(cid, Status.ERROR, f"the growth probe: {why}")
    per_token = probe.live_bytes / c["total"]
    # After the prefill's mark: the appends, `every` tokens a part (the last also the closing decode's token),
    # then that decode's attention (its own memory is the attention's, judged by the no-repeat criterion),
    # then the answer (or, for a run stopped for its time, the parts that finished).
    parts = task.segments()[1:-2] if not stopped else task.segments()[1:-1]
    held, cpu = [], []
    for j, part in enumerate(parts):
        start = min(c["prefill"] + j * c["every"], c["total"] + 1)
        count = max(min(c["every"], c["total"] + 1 - start), 0)
        if part["peak"] is not None and part["start"] is not None:
            # Beyond the tokens it wrote, in one of K or V (they are copied apart): an old buffer beside its copy.
            # The kernel charges a cgroup's memory a batch at a time, ahead of use (CHARGE_SLACK).
            beyond = part["peak"] - part["start"] - count * per_token - CHARGE_SLACK
            held.append(beyond / (start * per_token / 2))
        if part["cpu_s"] is not None and count > 1:
            # CPU time per append, in copies of the K/V the cache held at the stretch's start (``copy_s``: one
            # copy of all of it at the end, timed by the parent in this run).
            cpu.append(part["cpu_s"] / count / (copy_s * start / c["total"]) if copy_s > 0 else None)
    held_figure = max(held) if held else None
    timed = sorted(x for x in cpu if x is not None)
    cpu_figure = timed[len(timed) // 2] if timed else None  # the median stretch: a copy on most appends
    text = (f"{c['total'] - c['prefill']:,} one-token appends after a prefill of {c['prefill']:,} tokens at "
            f"{_layout(c)} ({_mib(probe.live_bytes)} of K/V at the end)"
            + (", stopped for their time" if stopped else "") + ": "
            + (f"the most any stretch of {c['every']:,} appends held beyond the tokens it wrote was "
               f"{max(held_figure, 0.0):.2f} times the live K (a copy of the cache holds its old K beside the new: "
               f"1 or more)" if held_figure is not None else "no memory figure per stretch of appends")
            + (f"; an append cost the CPU time of {cpu_figure:.2f} copies of the cache (the median stretch; a copy "
               f"on every append is 1)" if cpu_figure is not None else ""))
    measured = {k: round(v, 3) for k, v in (("growth_held", held_figure), ("growth_cpu", cpu_figure)) if v is not None}
    if held_figure is None and cpu_figure is None:
        return Criterion(cid, Status.ERROR, text + ": no figure to judge by" + (f" ({why})" if why else ""))
    if (held_figure is not None and BOUNDS["growth_held"].crossed(held_figure)) or \
            (cpu_figure is not None and BOUNDS["growth_cpu"].crossed(cpu_figure)):
        extra = "; ".join(explain or [])
        return Criterion(cid, Status.FAIL, text + ": the cache is copied as it grows" + (f"; {extra}" if extra else ""),
                         mistakes=["concat_growth"], figures=measured)
    if stopped:
        return Criterion(cid, Status.ERROR, f"the growth probe: {why}")
    return Criterion(cid, Status.PASS, text, figures=measured)


def overflow(probe) -> Criterion:
    """Appends past ``max_len``: a clear error, with ``lens`` and every row's live tokens unchanged.

    Bytes past a row's length are not the cache's state: writing them before
    raising is a note, never a failure. Moving ``lens`` is ``length_before_write``.
    """
    if not isinstance(probe, list) or not probe or not all(isinstance(o, dict) for o in probe):
        return _probe_error("overflow_atomic", probe)
    notes = []
    for o in probe:
        raised = o.get("raised")
        case = f"rows holding {o.get('lens_before')} of max_len 8, n_new={o.get('n_new')}"
        if o.get("lens_after") != o.get("lens_before"):
            return Criterion("overflow_atomic", Status.FAIL, f"failed append changed lens from {o.get('lens_before')} "
                             f"to {o.get('lens_after')} ({case})", mistakes=["length_before_write"])
        if not raised:
            return Criterion("overflow_atomic", Status.FAIL, f"an append past max_len raised nothing ({case})")
        if not raised.get("value_error"):
            return Criterion("overflow_atomic", Status.FAIL,
                             f"overflow raised {raised.get('type')}, not ValueError ({case})")
        if o.get("live_changed"):
            return Criterion("overflow_atomic", Status.FAIL,
                             f"failed append changed tokens a row already held ({case})")
        if o.get("past_lens_written") and not notes:
            notes.append(f"a failed append wrote rows past their length before raising ({case}); "
                         "lens and live tokens were unchanged, so the cache's state is intact")
    return Criterion("overflow_atomic", Status.PASS, "an append that overflows one row raises ValueError "
                     "and leaves lens and every row's live tokens unchanged (first and last row tried)", notes=notes)


def _same_as_twin(step: StepVerdict, outputs_by_trial: dict | None, twin_verdict: StepVerdict | None = None) -> bool:
    """Whether the decode after a failed append gave exactly what the same decode gave in the trial's twin
    (the same calls without that append): then the append changed nothing, whatever else is wrong."""
    from grader.stages.suite import TWIN

    if step.status == "raised" and twin_verdict is not None:
        # The decode raises after the failed append and in the twin alike: attention itself raises.
        return twin_verdict.status == "raised" and (twin_verdict.error or {}).get("type") == \
            (step.error or {}).get("type") and "attention" in twin_verdict.detail and "attention" in step.detail
    if not outputs_by_trial or step.status != "wrong":
        return False
    got = (outputs_by_trial.get(step.trial.name) or [None] * (step.index + 1))[step.index]
    twin = outputs_by_trial.get(step.trial.name + TWIN) or []
    twin_index = step.index - sum(1 for s in step.trial.steps[:step.index] if s.overflow)
    other = twin[twin_index] if twin_index < len(twin) else None
    return got is not None and other is not None and got.shape == other.shape and \
        bool(np.allclose(got, other, rtol=1e-12, atol=1e-12, equal_nan=True))


def overflow_from_trials(comparison: Comparison, outputs_by_trial: dict | None = None) -> Criterion:
    """Appends past ``max_len`` in the hidden trials: each must raise ValueError, and the decode step after
    it must give the output of a cache the failed append did not touch (``lens`` and live tokens).

    That output is the oracle's; or, when the decode is wrong anyway, the submission's own output on the
    trial's twin (the same calls without the failed append): a decode bug is not an overflow bug.
    Decided from outputs compared here; what the child says about the error only explains.
    """
    cid = "overflow_atomic"
    over, after = comparison.of_kind("overflow"), comparison.of_kind("after_overflow")
    if not over or all(s.status == "not_run" for s in over):
        return Criterion(cid, Status.ERROR, "no overflow step was run (an earlier append of its trial failed)")
    bad = next((s for s in over if s.status not in ("ok", "not_run")), None)
    if bad is not None:
        return Criterion(cid, Status.FAIL, f"{_where(bad)}: {bad.detail}")
    from grader.stages.suite import TWIN

    def twin_of(step):
        index = step.index - sum(1 for s in step.trial.steps[:step.index] if s.overflow)
        return next((s for s in comparison.steps if s.trial.name == step.trial.name + TWIN and s.index == index), None)

    wrong = first_failure([s for s in after if s.status != "not_run"
                           and not _same_as_twin(s, outputs_by_trial, twin_of(s))])
    if wrong is not None:
        moved = _lens_moved(wrong)
        if moved:
            return Criterion(cid, Status.FAIL, f"after an append past max_len raised, {_where(wrong)} {moved}",
                             mistakes=["length_before_write"])
        how = "raises" if wrong.status == "raised" else "gives the wrong output"
        return Criterion(cid, Status.FAIL, f"after an append past max_len raised, {_where(wrong)} {how}: the failed "
                         f"append changed the cache's state (lens or live tokens)")
    twins = [s for s in after if _same_as_twin(s, outputs_by_trial, twin_of(s))]
    return Criterion(cid, Status.PASS, f"{len(over)} appends past max_len (first and last row overflowing) raise "
                     "ValueError, and the decode step after each matches a cache they did not touch"
                     + (" (the same decode without the failed append: the decode itself is wrong, see Decode)"
                        if twins else ""))


def _lens_moved(step: StepVerdict) -> str:
    """Why ``step`` (the decode after a failed append) shows lens moved by that append, or "".

    The pattern: the decode append raises an overflow exactly where the rows
    that overflowed would be full had the failed append moved their lengths
    (and nowhere else would it raise: every row has room for one token).
    """
    if step.status != "raised" or not (step.error or {}).get("value_error") or "append" not in step.detail:
        return ""
    trial = step.trial
    over = next(s for s in trial.steps[:step.index] if s.overflow)
    lens = sum((s.n_new for s in trial.steps[:step.index] if not s.overflow), np.zeros(trial.B, dtype=np.int64))
    moved = lens + over.n_new
    full = [b for b in range(trial.B) if moved[b] + step.trial.steps[step.index].n_new[b] > trial.max_len]
    if not full:
        return ""
    rows = ", ".join(f"lens[{b}] = {int(moved[b])}" for b in full)
    return (f"raises on an append every row has room for, as it would had the failed append moved lens (to "
            f"{rows} at most; max_len {trial.max_len}): lengths moved before the write finished")


def live_length(small: list, large: list, check_output: bool = True, appends_copy: bool = False) -> Criterion:
    """The same decode steps in a reservation a little above the live length and in one many times larger.

    ``small`` and ``large`` are lists of ``(probe, task, built)``, runs of one reservation alike (the
    cheapest counts, as what else runs on the machine only adds CPU time). The figure is the kernel's CPU
    time of the decode steps after the second, a part of its own between marks: what making the cache
    costs (a ``max_len``^2 mask table, zeroing the reservation) and the first steps are outside it, and its
    query is handed over only at the first step's mark. ``appends_copy``: the growth probe found appends
    that copy the cache; each decode step appends its token first, so a scan cannot be timed apart and
    ``max_len_scan`` is not named (the criterion errors, saying why).
    """
    cid = "live_length"
    cheapest = {}
    for label, runs in (("small", small), ("large", large)):
        if not runs:
            return Criterion(cid, Status.ERROR, f"the live-length probe ({label} reservation) was not planned")
        for probe, task, built in runs:
            why = probe_failure(task, built, check_output)
            if why:
                return Criterion(cid, Status.ERROR, f"the live-length probe ({label} reservation): {why}")
        steps = [(run, run[1].segments()[-2]["cpu_s"]) for run in runs]  # the last part is the answer's
        if any(cpu is None for _, cpu in steps):
            return Criterion(cid, Status.ERROR, f"the live-length probe ({label} reservation) has no CPU figure")
        cheapest[label] = min(steps, key=lambda pair: pair[1])
    ((p_small, _, _), s_small), ((p_large, _, _), s_large) = cheapest["small"], cheapest["large"]
    factor = p_large.config["max_len"] / max(p_small.config["max_len"], 1)
    ratio = s_large / s_small if s_small > 0 else float("inf")
    text = (f"{p_small.config['decodes'] - 2} decode steps at {p_small.config['live']:,} live tokens, "
            f"{_layout(p_small.config)}: {s_large * 1e3:.0f} ms CPU in a {factor:.1f}x larger reservation vs "
            f"{s_small * 1e3:.0f} ms ({ratio:.1f}x; making the cache is not in either)")
    measured = {"scan": round(ratio, 3)}
    if not BOUNDS["scan"].crossed(ratio):
        return Criterion(cid, Status.PASS, text, figures=measured)
    if appends_copy:
        return Criterion(cid, Status.ERROR, text + ": not judged, as the appends copy the cache (see the in-place "
                         "criterion) and each step appends a token, a scan of max_len by the attention cannot be "
                         "timed apart", figures=measured)
    return Criterion(cid, Status.FAIL, text + ": attention scans max_len", mistakes=["max_len_scan"], figures=measured)


def cost_model(probe, expected: dict) -> Criterion:
    """``probe`` maps each call label to what the submission's cost.py returned."""
    if probe is None:
        return Criterion("cost_model", Status.NOT_ATTEMPTED, "no cost.py")
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("cost_model", probe)
    wrong = []
    for label, want in expected.items():
        got = probe.get(label)
        ok = isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))
        if not ok:
            wrong.append(f"{label} gave {got!r}, expected {want!r}")
    if wrong:
        return Criterion("cost_model", Status.FAIL, f"{len(wrong)} of {len(expected)} figures wrong; first: {wrong[0]}")
    return Criterion("cost_model", Status.PASS, f"all {len(expected)} figures of the cost table reproduced")


def input_errors(probe) -> list[str]:
    """Notes for bad inputs that raise nothing, or something other than ValueError/TypeError."""
    if not isinstance(probe, dict) or "error" in probe:
        return []
    notes = []
    for case, outcome in probe.items():
        raised = outcome.get("raised") if isinstance(outcome, dict) else None
        if not raised:
            notes.append(f"bad input '{case}' raised nothing")
        elif not raised.get("value_error"):
            notes.append(f"bad input '{case}' raised {raised.get('type')}, not ValueError/TypeError")
    return notes


def _probe_error(cid: str, probe) -> Criterion:
    if isinstance(probe, dict) and "error" in probe:
        err = probe["error"]
        return Criterion(cid, Status.ERROR, f"the check raised {err.get('type')}: {err.get('message')}")
    return Criterion(cid, Status.ERROR, "the check did not report (the child died or was stopped before it)")
