"""From measurements to criteria: each rubric criterion's status, evidence and mistakes.

Every function here reads data the parent already holds (step verdicts from
``compare``, probe measurements the child reported) and decides one criterion.
Nothing is guessed from source. Thresholds, with their reasons:

* ``concat_growth``: 300 one-token appends after a prefill add 0.5x the live
  K/V or more to the peak of the prefill alone (a copy holds old and new), or
  CPU time worth 150 copies of the cache, a copy's CPU time measured by the
  parent in the same run (a copy per append is 300; in place, next to nothing
  of either. On this 2-core machine, two batches of every example side by
  side: the in-place examples up to +0.23x and 36 copies, the cache that
  grows in capacity steps +1.0x to +1.1x, the concatenating one +0.64x and
  1,074 to 1,293 copies; a copy timed by the wall clock had once shrunk the
  last to 90. The memory figures hold only because every task allocates the same
  way, whatever ran before it: ``grader.child.zygote`` fixes glibc's mmap threshold;
  left to move, it put an in-place cache at +0.9x in one run of four). The
  run of the prefill alone, subtracted from the appends' run, counts for at
  most 50 copies: it ends differently, so a cache can tell it apart and make
  it dearer, and the appends' CPU must still show. Appends so
  dear that their run is stopped for its time are named by the kernel's CPU
  figure up to the stop, when it is past the limit (else nothing is judged).
  The probe fills 2,048 tokens (16 MiB of live K/V at 32/8): a mask table of
  max_len^2 entries made with the cache (nanoGPT's float64 buffer of ones: 45
  MB there) faults its pages in by a time that varies from run to run (system
  time; 0.3 to 3.2 s for the same table at 8,192 tokens, measured), and at this
  size that stays below the copies that name a mistake.
* ``kv_repeat``: a decode step's process peaks max(1.5, 0.3 (G - 1)) times the
  live K/V or more above the same decode at G = 1 (its twin: the same cache,
  tokens and max_len). A repeat of K alone adds about (G - 1)/2, of K and V
  G - 1; honest code adds what its scores add, a few percent. The submission
  can tell the twin and each layout apart (it sees q's heads) and hold as
  much at G = 1, so at every layout (128/8, 64/8, 32/8: 8 KV heads, where a
  gpt-fast mask table of max_len^2 entries is small beside the live K/V) a
  peak of max(7.5, 1 + 0.4 G) times the live K/V fails the criterion whatever
  the twin holds, without naming a mistake: a repeat of K and V held at once
  peaks 1 + G (9x at G = 8), half of it at a time 1 + G/2 (9x at G = 16).
  Honest code holds about 2x, and up to about 5x with float64 working copies
  of K and V (measured 4.7x) or a float mask table of max_len^2 entries made
  with the cache (3.3x in float32, 4.5x in nanoGPT's float64, at the probes'
  2,048 tokens), 6.4x with both, so a repeat at G = 4 alone (5x) cannot be
  told from it by memory.
* ``max_len_scan``: the same 64 decode steps take at least 3x the CPU time in an
  8x larger reservation, the cheaper of two runs of each (what else runs on
  the machine only adds CPU time: an honest cache's larger run once took 2.8x
  its smaller one), less what making the cache and prefill (run alone) costs
  more in the larger reservation, so that a cache zeroed whole when made
  (torch.zeros, as gpt-fast) is judged by its decode steps. The reservation past the live tokens was
  never written, so a scan reads the kernel's zero page there, cheaply: the
  scanning examples measured 5.0x to 6.0x (single whole runs 4.1x to 7.8x,
  below 4x once in CI), the honest ones 0.8x to 1.4x, every example graded
  in two batches side by side (seeds 101 and 404). The making runs are run
  twice too, the cheaper counting. A cache whose making costs more than 0.1 s
  more in the larger reservation is not judged: a table of max_len^2 entries
  made with the cache (gpt-fast's mask) costs 0.3 to 9 s there, from run to
  run of the same code (page faults), beside 0.1 s of decode steps, so no
  figure tells the steps' time apart (at 0.25 s, a bool table's making was
  once judged, and a real scan named, in one seed of five); a cache without
  one differs by 0.06 s at most (measured). Code that can tell the larger
  reservation's making run apart can spend up to that 0.1 s there, taken off
  its decode steps: wasted time can hide a cheap scan, as docs/security.md
  says.

Memory and CPU figures are the kernel's, taken from outside the submission's
process (``grader.sandbox.launch``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grader.compare import Comparison, StepVerdict, first_failure

REPEAT_FACTOR = 0.3  # of (G - 1) x the live K/V, above the twin at G = 1: the extra peak that names a repeat
REPEAT_MIN_EXTRA = 1.5  # ... and never below 1.5x the live K/V
REPEAT_HELD = 0.4  # of G x the live K/V: a peak that fails at a layout whatever its twin holds ...
# ... and never below 7.5x: honest code can hold up to about 6.5x (K and V upcast to float64 with a contiguous
# K^T, 4.7x, beside a float64 mask table of max_len^2 entries: 6.2x to 6.4x, measured). A whole repeat held at
# once clears it at G = 8 (9x), not at G = 4 (5x); half of one at G = 16 (9x).
REPEAT_HELD_FLOOR = 7.5


def held_bound(G: int) -> float:
    """The peak, in live K/V, at or above which a decode at group size ``G`` holds memory per query head."""
    return max(REPEAT_HELD_FLOOR, 1 + REPEAT_HELD * G)
GROWTH_FRACTION = 0.5  # extra peak of the appends, in live K/V, that names growth by copying
PREFILL_LIMIT = 2.5  # what one prefill adds to the empty cache's peak, in live K/V: the cache, a copy of the input, slack
GROWTH_COPIES = 150.0  # CPU time of the 300 appends, in copies of the live K/V, that names it too (one in two)
PREFILL_COPIES = 50.0  # the most CPU time, in copies, subtracted for the prefill alone (honest: a few copies)
SCAN_RATIO = 3.0  # see the module docstring: between honest code's 1.4x and a scan's 5x
MAKING_LIMIT_S = 0.1  # see the module docstring: what making the cache may cost more in the larger reservation
PROBE_TOLERANCE = 1e-4  # float32 probe outputs against the float64 computation


@dataclass
class Criterion:
    """One rubric line: ``status`` is pass, fail, not_attempted or error."""

    id: str
    status: str
    evidence: str
    mistakes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    caps: str = ""  # the port only: why it caps the tier though no mistake is named (it could not be measured)
    silent: bool = False  # some step returned a wrong output (rather than raising): silently wrong
    unjudgeable: bool = False  # error: the code ran and measured, but no figure can tell (not the port's fault)


def _where(step: StepVerdict) -> str:
    """A failing step's configuration, in words, with no hidden value."""
    return f"step {step.index + 1} of trial '{step.trial.name}' ({step.trial.describe()})"


def _refused(step: StepVerdict) -> bool:
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
        return Criterion(cid, "error", f"no {what} step was run")
    bad = first_failure(steps)
    if bad is None:
        worst = max(s.max_error for s in steps)
        return Criterion(cid, "pass", f"{len(steps)} {what} steps match the direct reference (max error {worst:.1e})")
    failing = [s for s in steps if s.status != "ok"]
    ran = [s for s in refusable or [] if s.status != "not_run"]
    if refusable is not None and ran and all(_refused(s) for s in failing) and all(_refused(s) for s in ran):
        return Criterion(cid, "not_attempted",
                         f"{what} refused with a clear error ({bad.error.get('type')}: {bad.error.get('message')})")
    how = {"wrong": f"wrong output (max error {bad.max_error:.1e})", "raised": bad.detail,
           "bad_output": bad.detail, "not_run": bad.detail}[bad.status]
    return Criterion(cid, "fail", f"{len(failing)} of {len(steps)} {what} steps fail; first: {_where(bad)}: {how}",
                     silent=any(s.status == "wrong" for s in failing))


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
    if result.status == "pass":
        result.evidence = f"one-token rows in layouts {layouts}: query head h returns v of KV head h // G"
        return result
    if outputs_by_trial is None or result.status != "fail":
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
        result = Criterion("head_mapping", "error",
                           f"could not be told: one-token rows return no KV head's value (first: "
                           f"{_where(unknown[0][0])}); the outputs are wrong for another reason")
    return result


def padding(comparison: Comparison) -> Criterion:
    """Padded slots and zero-token rows: finite required, exactly 0 asked for."""
    padded = [s for s in comparison.steps if s.padding != "none"]
    if not padded:
        return Criterion("padding", "error", "no step with padded slots returned an output")
    nonfinite = [s for s in padded if s.padding == "nonfinite"]
    if nonfinite:
        smallest = min(nonfinite, key=lambda s: (s.trial.size, s.index))
        return Criterion("padding", "fail", f"{len(nonfinite)} of {len(padded)} steps with padded slots or "
                         f"zero-token rows return NaN or inf there; smallest: {_where(smallest)}",
                         mistakes=["nan_padding"])
    result = Criterion("padding", "pass", f"{len(padded)} steps with padded slots or zero-token rows: all finite")
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


def probe_failure(task, config: dict, expected, check_output: bool = True) -> str:
    """Why a probe task gives no figure to decide on ("" when it ran and its output is right).

    ``check_output`` is off when decode is wrong on the hidden trials too: a wrong
    probe output is then that same mistake, not a "measurement mode", and the
    figure stands. The stored keys of an append-only probe are always checked.
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
    records = (answer.get("records") or [[]])[0] if isinstance(answer.get("records"), list) else []
    failed = next((r for r in records if isinstance(r, dict) and r.get("stage") in ("init", "append", "attention")),
                  None)
    if failed is not None:
        err = failed.get("error") or {}
        return f"raised {err.get('type')} in {failed.get('stage')}: {err.get('message')}"
    got = np.frombuffer(task.blob, dtype="<f8") if len(task.blob) % 8 == 0 else np.zeros(0)
    want = np.asarray(expected).ravel()
    if got.size < want.size:
        return f"returned {got.size} values for an output of {want.size}"
    got = got[got.size - want.size:]  # the last output: the last decode step's, or the stored keys
    if not check_output and not any(isinstance(r, dict) and r.get("stage") == "tail" for r in records):
        return ""
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    if not np.isfinite(err) or err > PROBE_TOLERANCE:
        return f"its output at this size does not match the reference (max error {err:.1e})"
    return ""


def _held(probe, task) -> int:
    """The memory the submission held at its peak: a peak-RSS figure also counts the mapped prefill inputs."""
    return task.memory_bytes - (probe.input_bytes if task.memory_source == "rss" else 0)


def _layout(config: dict) -> str:
    return f"Hq/Hkv = {config['Hkv'] * config['G']}/{config['Hkv']}"


def no_repeat(runs: list, check_output: bool = True) -> Criterion:
    """Decode at real checkpoint layouts, each beside its twin with one query head per KV head: the
    kernel's peak memory of the two processes, the difference against the live K/V.

    ``runs`` holds ``(probe, task, expected)`` per probe (``grader.run.Probe``,
    ``launch.TaskResult``, the output the parent computed); a layout and its
    twin share the cache's shape, tokens and ``max_len``. A K/V repeat adds
    about G - 1 times the live K/V to the difference, wherever it is written
    (NumPy, torch, mmap, shared memory); what the cache holds whatever the
    heads (its buffers, a mask table of ``max_len^2`` entries) is in both.
    """
    cid = "no_kv_repeat"
    key = lambda c: (c["Hkv"], c["d"], c["total"], c["max_len"])  # noqa: E731 - the cache a layout shares
    twins = {key(p.config): (p, t, e) for p, t, e in runs if p.config["G"] == 1}
    layouts = [(p, t, e) for p, t, e in runs if p.config["G"] > 1]
    if not layouts:
        return Criterion(cid, "error", "no memory probe was planned")
    figures, worst, pairs = [], None, []
    for run in layouts:
        twin_run = twins.get(key(run[0].config))
        if twin_run is None:
            return Criterion(cid, "error", "a memory probe has no twin at G = 1")
        for probe, task, expected in (run, twin_run):
            why = probe_failure(task, probe.config, expected, check_output)
            if why:
                return Criterion(cid, "error", f"the memory probe at {_layout(probe.config)}: {why}")
        pairs.append((run, twin_run))
    for (probe, task, _), (twin, twin_task, _) in pairs:
        G = probe.config["G"]
        extra = (_held(probe, task) - _held(twin, twin_task)) / probe.live_bytes
        limit = max(REPEAT_MIN_EXTRA, REPEAT_FACTOR * (G - 1))
        # Below 0 is the two processes' noise: shown as no difference.
        figures.append(f"{_layout(probe.config)}: {max(extra, 0.0):+.1f}x the live K/V ({_mib(probe.live_bytes)}) above "
                       f"{_layout(twin.config)} (peaks {_held(probe, task) / probe.live_bytes:.1f}x and "
                       f"{_held(twin, twin_task) / twin.live_bytes:.1f}x)")
        if extra >= limit and (worst is None or extra - limit > worst[0]):
            worst = (extra - limit, probe, twin, extra, G)
    source = runs[0][1].memory_source if runs[0][1] is not None else "cgroup"
    meter = "the sandbox's cgroup" if source == "cgroup" else "the process's peak RSS (wait4)"
    # Memory the same at G = 1 cancels in the difference, and a submission can make it so (it sees the
    # heads, and can tell the twin and each layout apart): at every layout, where a mask table of max_len^2
    # entries is about 1x, a peak near half of K/V per query head fails whatever the twin holds.
    for (probe, task, _), _twin in sorted(pairs, key=lambda pair: -pair[0][0].config["G"]):
        held, G = _held(probe, task) / probe.live_bytes, probe.config["G"]
        bound = held_bound(G)
        if not worst and held >= bound:
            return Criterion(cid, "fail", f"decode at {_layout(probe.config)} holds {held:.1f}x the live K/V "
                             f"({meter}), {bound:.1f}x or more, and its twin at G = 1 about as much: memory for K/V "
                             f"per query head, or half of it at once, whatever the heads (a cache read in place "
                             f"holds about 2x). All layouts: " + "; ".join(figures))
    if worst:
        _, probe, twin, extra, G = worst
        return Criterion(cid, "fail", f"decode at {_layout(probe.config)} peaks {extra:.1f}x the live K/V above the "
                         f"same decode at {_layout(twin.config)} ({meter}); read in place, the two are about equal, "
                         f"a repeat adds {G - 1}x or more: K/V materialised per query head. All layouts: "
                         + "; ".join(figures), mistakes=["kv_repeat"])
    return Criterion(cid, "pass", "decode measured by " + meter + ", each layout against its twin at G = 1: "
                     + "; ".join(figures) + " (a repeat would add about G - 1 times)")


def in_place(runs: list, copy_s: float, explain: list | None = None) -> Criterion:
    """One-token appends at a large live length, against the same prefill alone: the kernel's figures.

    ``runs`` is ``[(probe, task, expected)]`` for the probe with appends and
    the one without (``grader.run.probes``); ``copy_s`` the CPU seconds this
    machine takes to copy the live K/V once, measured in the same run (``grader.run.copy_seconds``). Writing
    in place adds next to nothing; growing by concatenation or by
    reallocate-and-copy holds the old and the new buffer at once (memory) and
    copies the cache again and again (CPU). ``explain`` adds what in-process
    meters saw (buffer identity), as explanation only.
    """
    cid = "preallocated_in_place"
    role = lambda c: "empty" if c.get("empty") else "appends" if c["appends"] > 0 else "prefill"  # noqa: E731
    by_name = {role(p.config): (p, t, e) for p, t, e in runs}
    if set(by_name) != {"empty", "appends", "prefill"}:
        return Criterion(cid, "error", "the growth probes were not planned")
    stopped = ""  # why the run with appends has no answer, when it was stopped for its time
    for name, (probe, task, expected) in by_name.items():
        why = probe_failure(task, probe.config, expected)
        if why and name == "appends" and task is not None and task.stopped == "timeout":
            stopped = why  # the kernel's CPU figure up to the stop still says what the appends cost
        elif why:
            return Criterion(cid, "error", f"the growth probe: {why}")
    (probe, task, _), (base_probe, base, _) = by_name["appends"], by_name["prefill"]
    empty_probe, empty, _ = by_name["empty"]
    live = probe.live_bytes
    # What the prefill adds to the cache made and left empty: what the cache builds once is not the prefill's.
    prefill = (_held(base_probe, base) - _held(empty_probe, empty)) / base_probe.live_bytes
    if prefill > PREFILL_LIMIT:
        # Above this, a copy made while appending could hide under the prefill's own peak: no figure
        # about the appends can be trusted, and the prefill itself holds far more than the cache.
        return Criterion(cid, "fail", f"a prefill of {base_probe.config['live']:,} tokens into the empty cache at "
                         f"{_layout(base_probe.config)} adds {prefill:.1f}x the live K/V to the peak of the cache "
                         f"made and left empty (the cache plus one copy of the new tokens is 2x): the append holds "
                         f"far more than the tokens it writes (copies of the cache or of the input)")
    if stopped:
        # Appends so dear that the run did not finish: named when what they had cost by then shows the pattern.
        spent = max(task.cpu_s - min(base.cpu_s, PREFILL_COPIES * copy_s), 0.0)
        copies = spent / copy_s if copy_s > 0 else 0.0
        if copies < GROWTH_COPIES:
            return Criterion(cid, "error", f"the growth probe: {stopped}")
        return Criterion(cid, "fail", f"{probe.config['appends']} one-token appends after a prefill of "
                         f"{probe.config['live']:,} tokens at {_layout(probe.config)} ({_mib(live)} live) did not "
                         f"finish in time; by then they had used {spent * 1e3:.0f} ms CPU beyond the prefill alone "
                         f"(the time of about {round(copies)} copies of the live K/V; copying them on every append "
                         f"would be about {probe.config['appends']}): the cache is copied as it grows",
                         mistakes=["concat_growth"])
    memory = (task.memory_bytes - base.memory_bytes) / live
    # The prefill alone is credited with its own CPU time up to PREFILL_COPIES: the run without appends ends
    # differently, so a cache can tell it apart and inflate it, and the difference must not hide the appends.
    prefill_cpu = min(base.cpu_s, PREFILL_COPIES * copy_s)
    copies = max(task.cpu_s - prefill_cpu, 0.0) / copy_s if copy_s > 0 else 0.0
    shown = round(copies)
    text = (f"{probe.config['appends']} one-token appends after a prefill of {probe.config['live']:,} tokens at "
            f"{_layout(probe.config)} ({_mib(live)} live): {max(memory, 0.0):+.2f}x the live K/V in peak memory "
            f"and {max(task.cpu_s - prefill_cpu, 0) * 1e3:.0f} ms CPU (the time of "
            f"{'less than one copy' if shown == 0 else f'about {shown} cop' + ('y' if shown == 1 else 'ies')} of "
            f"the live K/V; copying them on every append would be about {probe.config['appends']}) beyond the "
            f"prefill alone")
    if memory >= GROWTH_FRACTION or copies >= GROWTH_COPIES:
        extra = "; ".join(explain or [])
        return Criterion(cid, "fail", text + ": the cache is copied as it grows"
                         + (f"; {extra}" if extra else ""), mistakes=["concat_growth"])
    return Criterion(cid, "pass", text)


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
            return Criterion("overflow_atomic", "fail", f"failed append changed lens from {o.get('lens_before')} "
                             f"to {o.get('lens_after')} ({case})", mistakes=["length_before_write"])
        if not raised:
            return Criterion("overflow_atomic", "fail", f"an append past max_len raised nothing ({case})")
        if not raised.get("value_error"):
            return Criterion("overflow_atomic", "fail", f"overflow raised {raised.get('type')}, not ValueError ({case})")
        if o.get("live_changed"):
            return Criterion("overflow_atomic", "fail", f"failed append changed tokens a row already held ({case})")
        if o.get("past_lens_written") and not notes:
            notes.append(f"a failed append wrote rows past their length before raising ({case}); "
                         "lens and live tokens were unchanged, so the cache's state is intact")
    return Criterion("overflow_atomic", "pass", "an append that overflows one row raises ValueError "
                     "and leaves lens and every row's live tokens unchanged (first and last row tried)", notes=notes)


def _same_as_twin(step: StepVerdict, outputs_by_trial: dict | None, twin_verdict: StepVerdict | None = None) -> bool:
    """Whether the decode after a failed append gave exactly what the same decode gave in the trial's twin
    (the same calls without that append): then the append changed nothing, whatever else is wrong."""
    from grader.suite import TWIN

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
        return Criterion(cid, "error", "no overflow step was run (an earlier append of its trial failed)")
    bad = next((s for s in over if s.status not in ("ok", "not_run")), None)
    if bad is not None:
        return Criterion(cid, "fail", f"{_where(bad)}: {bad.detail}")
    from grader.suite import TWIN

    def twin_of(step):
        index = step.index - sum(1 for s in step.trial.steps[:step.index] if s.overflow)
        return next((s for s in comparison.steps if s.trial.name == step.trial.name + TWIN and s.index == index), None)

    wrong = first_failure([s for s in after if s.status != "not_run"
                           and not _same_as_twin(s, outputs_by_trial, twin_of(s))])
    if wrong is not None:
        moved = _lens_moved(wrong)
        if moved:
            return Criterion(cid, "fail", f"after an append past max_len raised, {_where(wrong)} {moved}",
                             mistakes=["length_before_write"])
        how = "raises" if wrong.status == "raised" else "gives the wrong output"
        return Criterion(cid, "fail", f"after an append past max_len raised, {_where(wrong)} {how}: the failed "
                         f"append changed the cache's state (lens or live tokens)")
    twins = [s for s in after if _same_as_twin(s, outputs_by_trial, twin_of(s))]
    return Criterion(cid, "pass", f"{len(over)} appends past max_len (first and last row overflowing) raise "
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


def live_length(small, large, check_output: bool = True, appends_copy: bool = False, bases=(None, None)) -> Criterion:
    """The same decode steps in a reservation of the live length and in one ``SCAN["ratio"]`` times larger.

    ``small`` and ``large`` are ``(probe, task, expected)``, or lists of such
    runs of one reservation (alike: the cheapest counts, as what else runs on
    the machine only adds CPU time); the figure is the kernel's CPU time of
    each process (same imports, same tokens, same steps). ``bases`` are the
    same for each reservation's cache and prefill without the decode steps:
    what making costs more in the larger one is taken off the larger run, so
    that a cache dearer to make in a larger reservation (zeroed whole, as
    torch.zeros does) is judged by its decode steps; time wasted in both base
    runs cancels. Where making the cache costs more than
    ``MAKING_LIMIT_S`` more in the larger one, that cost (which varies many
    times over from run to run) may be all of the difference, or hide it, and
    nothing is judged. Without a base's figure only a ratio of the whole runs
    below ``SCAN_RATIO`` is judged (a pass). ``appends_copy``: the growth probe
    found appends that copy the cache. Each decode step here appends its token
    first, so a slower large reservation may be the appends copying it:
    ``max_len_scan`` is then not named (the criterion errors, saying why).
    """
    cid = "live_length"
    cheapest = {}
    for label, runs in (("small", small), ("large", large)):
        runs = runs if isinstance(runs, list) else [runs]
        if not runs:
            return Criterion(cid, "error", f"the live-length probe ({label} reservation) was not planned")
        for probe, task, expected in runs:
            why = probe_failure(task, probe.config, expected, check_output)
            if why:
                return Criterion(cid, "error", f"the live-length probe ({label} reservation): {why}")
        cheapest[label] = min(runs, key=lambda run: run[1].cpu_s)
    (p_small, t_small, _), (p_large, t_large, _) = cheapest["small"], cheapest["large"]
    factor = p_large.config["max_len"] // max(p_small.config["max_len"], 1)
    whole = t_large.cpu_s / t_small.cpu_s if t_small.cpu_s > 0 else float("inf")
    text = (f"{p_small.config['decodes']} decode steps at {p_small.config['live']:,} live tokens: "
            f"{t_large.cpu_s * 1e3:.0f} ms CPU in a {factor}x larger reservation vs {t_small.cpu_s * 1e3:.0f} ms "
            f"({whole:.1f}x)")
    missing, cheapest_base = [], []
    for label, base in zip(("small", "large"), bases):
        base = (base if isinstance(base, list) else [base]) if base else []
        whys = [probe_failure(run[1], run[0].config, run[2]) for run in base] or ["it was not planned"]
        if any(whys):
            missing.append(f"making the cache and the prefill alone in the {label} reservation gave no figure "
                           f"({next(w for w in whys if w)}) to tell the decode steps' time from")
        else:
            cheapest_base.append(min(run[1].cpu_s for run in base))
    if missing:
        if whole < SCAN_RATIO:
            return Criterion(cid, "pass", text)
        return Criterion(cid, "error", text + ": not judged, as " + missing[0])
    small_base, large_base = cheapest_base
    # Only what making costs more in the larger reservation is taken off: the base runs can be told apart
    # (no attention after the prefill), and time wasted in both cancels here instead of hiding the steps.
    making = large_base - small_base
    large_steps = max(t_large.cpu_s - max(making, 0.0), 0.0)
    ratio = large_steps / t_small.cpu_s if t_small.cpu_s > 0 else float("inf")
    text += (f"; without what making the cache and its prefill (run alone) costs more there "
             f"({max(making, 0.0) * 1e3:.0f} ms): {large_steps * 1e3:.0f} ms, {ratio:.1f}x")
    if making > MAKING_LIMIT_S:
        # Neither way: the run with decode steps made its cache again, at a cost that varies many times over.
        return Criterion(cid, "error", text + f"; making the cache and the prefill alone cost {making * 1e3:.0f} ms "
                         "more in the larger reservation: not judged, as that cost varies many times over from run "
                         "to run and may be all of the difference (something of max_len's size made with the "
                         "cache or in its prefill, such as a mask table of max_len^2 entries or a copy of the "
                         "reservation)", unjudgeable=True)
    if ratio < SCAN_RATIO:
        return Criterion(cid, "pass", text)
    if appends_copy:
        return Criterion(cid, "error", text + ": not judged, as the appends copy the cache (see the in-place "
                         "criterion) and each step appends a token, a scan of max_len by the attention cannot be "
                         "timed apart")
    return Criterion(cid, "fail", text + ": attention scans max_len", mistakes=["max_len_scan"])


def cost_model(probe, expected: dict) -> Criterion:
    """``probe`` maps each call label to what the submission's cost.py returned."""
    if probe is None:
        return Criterion("cost_model", "not_attempted", "no cost.py")
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("cost_model", probe)
    wrong = []
    for label, want in expected.items():
        got = probe.get(label)
        ok = isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))
        if not ok:
            wrong.append(f"{label} gave {got!r}, expected {want!r}")
    if wrong:
        return Criterion("cost_model", "fail", f"{len(wrong)} of {len(expected)} figures wrong; first: {wrong[0]}")
    return Criterion("cost_model", "pass", f"all {len(expected)} figures of the cost table reproduced")


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
        return Criterion(cid, "error", f"the check raised {err.get('type')}: {err.get('message')}")
    return Criterion(cid, "error", "the check did not report (the child died or was stopped before it)")


@dataclass(frozen=True)
class CriterionSpec:
    """One criterion of the registry: what it means and what decides it (points and tier are the rubric's)."""

    id: str
    title: str
    decided_by: str  # the function of this module that decides it
    reads: tuple  # step kinds ("decode", ...), trial names ("head-map-*"), probes ("probe:grow") or files it reads


# The one registry of criteria. grader/rubric.toml gives each id its points and its tier;
# the grader decides each with ``decided_by`` from the evidence in ``reads``; reports,
# the notebook and the learner's checks use these ids and titles.
REGISTRY = {spec.id: spec for spec in (
    CriterionSpec("preallocated_in_place", "Preallocated cache, written in place at the current length",
                  "in_place", ("probe:grow",)),
    CriterionSpec("no_kv_repeat", "No materialised K/V repeat", "no_repeat", ("probe:memory",)),
    CriterionSpec("head_mapping", "Query head h reads KV head h // G", "head_mapping", ("head-map-*",)),
    CriterionSpec("decode", "Decode (T = 1), rows of one length", "correctness", ("decode",)),
    CriterionSpec("full_prefill", "Full prefill (T = S), rows of one length", "correctness", ("full_prefill",)),
    CriterionSpec("chunked_prefill", "Chunked prefill (1 < T < S): bottom-right mask", "correctness",
                  ("chunked_prefill",)),
    CriterionSpec("ragged_rows", "Ragged rows and zero-token rows", "correctness", ("ragged",)),
    CriterionSpec("padding", "Padded query slots finite (exactly 0)", "padding", ("padded slots of every step",)),
    CriterionSpec("overflow_atomic", "Overflow raises and changes nothing", "overflow_from_trials",
                  ("overflow", "after_overflow")),
    CriterionSpec("cost_model", "Cost quantified (cost.py)", "cost_model", ("cost.py",)),
    CriterionSpec("own_tests", "Own tests: pass, and catch the chunk-local mask", "grader.owntests.criterion",
                  ("test_*.py",)),
    CriterionSpec("live_length", "Attention over the live length, not max_len", "live_length", ("probe:scan",)),
    CriterionSpec("torch_port", "PyTorch port: right, in place, no repeat", "grader.grade._torch_section",
                  ("kv_cache_torch.py",)),
)}
# Criteria decided by comparing outputs step by step: {id: step kind}.
OUTPUT_CHECKS = {cid: spec.reads[0] for cid, spec in REGISTRY.items() if spec.decided_by == "correctness"}
WHAT = {"decode": "decode", "full_prefill": "full prefill", "chunked_prefill": "chunked prefill",
        "ragged": "ragged-row"}
