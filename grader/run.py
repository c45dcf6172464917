"""Run a laid-out submission in the sandbox: one session per implementation, measured from outside.

The NumPy session runs the hidden trials, then the probes at realistic sizes
(each a process of its own, forked from the trusted zygote), then the
candidate's own tests, one process per variant. The port's session runs the
same trials and probes with torch tensors. Every figure a criterion decides on
comes from the kernel or the parent (``grader.sandbox.launch``); each probe
also returns its last decode output, which the parent checks.

Probe sizes (float32, d = 128 as in released checkpoints):

* memory: decode at Hq/Hkv = 128/8, 64/8 and 32/8 (Llama 3.1 405B, Llama 3
  70B and 8B: G = 16, 8, 4) and their twin 8/8, with about 16 MiB of live
  K/V (2,048 tokens);
* growth: 300 one-token appends after a prefill of about 2,048 tokens at 32/8
  (16 MiB live), so a capacity grown in steps of up to 256 tokens reallocates
  at least once, against the same prefill alone;
* live length: 64 decode steps at about 2,048 live tokens (32/8, d = 64) in a
  reservation of the live length and in one 8 times larger, and each one's
  cache and prefill alone.
Lengths move a few percent with the seed.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from catalogue import mutants
from grader import jobs, variants
from grader.child import protocol
from grader.sandbox import launch
from grader.suite import Trial

MIB = 2**20
# (Hq, Hkv): Llama 3.1 405B, Llama 3 70B and Llama 3 8B, G = 16, 8 and 4, all with 8 KV heads. A mask table
# of max_len^2 entries grows with the tokens squared, the live K/V with the tokens: with 8 KV heads of
# d = 128 and 2,048 tokens (16 MiB of live K/V) a bool table is a quarter of it, a float32 one (an additive
# mask) 1x and nanoGPT's float64 buffer of ones 2x, so a cache read in place holds about 1.5x to 4.5x
# whatever it keeps, its making's temporaries included (measured; at 4,096 tokens the float tables took
# honest code to 6x and 8.5x). A repeat (1 + G times, or 1 + G/2 held half at a time) stands above that at
# every layout: each is bounded absolutely (grader/criteria.py), and code that tells the layouts apart has
# no layout left to repeat at unseen. With fewer KV heads the table is 2x (2 heads) to 4x (MQA) the live
# K/V, and up to 12x and 24x at 8,192 tokens (measured in all): no absolute bound could tell there.
MEMORY_LAYOUTS = [(128, 8), (64, 8), (32, 8)]
MEMORY_KV_HEADS = 8
# The layouts share one twin with one query head per KV head (G = 1): the same cache, the same tokens, the
# same max_len. A repeat adds about G - 1 times the live K/V to the difference; anything the cache keeps
# whatever the heads (a max_len x max_len mask table, as gpt-fast builds) is in both.
MEMORY_TOKENS = 2048  # a real context; a mask table of max_len^2 entries stays small beside its K/V
# The growth and live-length probes at Llama-3-8B's layout (32/8): their caches hold 16 MiB and 8 MiB of K/V
# at 2,048 tokens, so a mask table of max_len^2 entries stays far below the sandbox's memory. Its making
# faults pages in by a time that varies from run to run: at 2,048 tokens that stays below the growth
# probe's 150 copies (at 8,192, nanoGPT's float64 table once cost 378 copies' worth), while at the
# live-length probe's larger reservation (about 17,000 tokens) it can outweigh the decode steps: that
# probe measures it apart.
GROW = {"Hq": 32, "Hkv": 8, "d": 128, "live_bytes": 16 * MIB, "appends": 300}
SCAN = {"Hq": 32, "Hkv": 8, "d": 64, "live_bytes": 8 * MIB, "decodes": 64, "ratio": 8, "runs": 2}
PROBE_D = 128
OWN_VARIANTS = ["none", mutants.CONTROL] + list(mutants.PLANTED)


@dataclass
class Probe:
    """One probe task: its configuration (what the child gets) and what the parent expects of it."""

    name: str
    purpose: str  # "memory", "grow", "scan"
    config: dict
    live_bytes: int  # the K/V bytes the cache holds at the end

    @property
    def input_bytes(self) -> int:
        """Bytes of the mapped prefill inputs (counted by a peak-RSS figure, not by the cgroup's)."""
        c = self.config
        return 2 * c["Hkv"] * c["live"] * c["d"] * 4


@dataclass
class Plan:
    """Everything one submission's sessions will run."""

    seed: int
    trials: list
    probes: list = field(default_factory=list)
    cost_calls: list = field(default_factory=list)
    test_files: list = field(default_factory=list)
    preimport: dict = field(default_factory=dict)  # backend -> installed modules to import first
    own_variants: dict = field(default_factory=dict)  # opaque task name -> own-tests variant (never sent with the job)

    serial_names: dict = field(default_factory=dict)  # "trials" or a probe's name -> its opaque, shuffled number

    def __post_init__(self):
        import random

        order = ["trials"] + [p.name for p in self.probes]
        numbers = list(range(len(order)))
        random.SystemRandom().shuffle(numbers)
        self.serial_names = dict(zip(order, numbers))
        names = [f"own:{i}" for i in range(len(OWN_VARIANTS))]
        variants = list(OWN_VARIANTS)
        random.SystemRandom().shuffle(variants)  # not from the seed: the order must tell a test nothing
        self.own_variants = dict(zip(names, variants))

    @property
    def own_order(self) -> list:
        return list(self.own_variants)

    def own_task(self, variant: str) -> str:
        """The opaque task name that ran ``variant``."""
        return next(name for name, v in self.own_variants.items() if v == variant)


def _tokens_for(live_bytes: int, kv_heads: int, d: int) -> int:
    return live_bytes // (2 * kv_heads * d * 4)


def probes(seed: int) -> list[Probe]:
    """The probe tasks for ``seed`` (lengths jittered a few percent)."""
    rng = np.random.default_rng([seed, 77])
    jitter = lambda n: int(n * (1 + rng.uniform(-0.03, 0.03)))  # noqa: E731
    out = []
    live, Hkv = jitter(MEMORY_TOKENS), MEMORY_KV_HEADS
    for heads in [Hq for Hq, _ in MEMORY_LAYOUTS] + [Hkv]:  # the layouts, then their twin (G = 1)
        cfg = {"Hkv": Hkv, "G": heads // Hkv, "d": PROBE_D, "live": live - 1, "appends": 0, "decodes": 1,
               "total": live, "max_len": live + 16, "seed": seed}
        out.append(Probe(f"memory-{heads}-{Hkv}", "memory", cfg, 2 * Hkv * live * PROBE_D * 4))
    live = jitter(_tokens_for(GROW["live_bytes"], GROW["Hkv"], GROW["d"]))
    cfg = {"Hkv": GROW["Hkv"], "G": GROW["Hq"] // GROW["Hkv"], "d": GROW["d"], "live": live,
           "appends": GROW["appends"], "decodes": 0, "total": live + GROW["appends"],
           "max_len": live + GROW["appends"] + 16, "seed": seed}
    out.append(Probe("grow", "grow", cfg, 2 * GROW["Hkv"] * (live + GROW["appends"]) * GROW["d"] * 4))
    # The same prefill without the appends: what the appends add is the difference (a prefill that
    # gathers its input into a temporary is honest, and costs as much memory as one copy).
    base = {**cfg, "appends": 0}
    out.append(Probe("grow-base", "grow", base, 2 * GROW["Hkv"] * live * GROW["d"] * 4))
    # ... and the cache alone, made and left empty: what the prefill adds is the difference (what the cache
    # builds once, such as a mask table of max_len^2 entries, is not the prefill's).
    out.append(Probe("grow-empty", "grow", {**base, "empty": True}, 2 * GROW["Hkv"] * live * GROW["d"] * 4))
    live = jitter(_tokens_for(SCAN["live_bytes"], SCAN["Hkv"], SCAN["d"]))
    for name, factor in (("scan-small", 1), ("scan-large", SCAN["ratio"])):
        total = live + SCAN["decodes"]
        cfg = {"Hkv": SCAN["Hkv"], "G": SCAN["Hq"] // SCAN["Hkv"], "d": SCAN["d"], "live": live, "appends": 0,
               "decodes": SCAN["decodes"], "total": total, "max_len": factor * (total + 8)}
        # Twice, alike: the criterion reads the cheaper run of each reservation, since what else runs on the
        # machine only ever adds CPU time (an honest cache's larger run once took 2.8x its smaller one). Each
        # run has tokens of its own: the tasks of a session share a working folder, and a run whose outputs an
        # earlier one had computed could load them from there rather than scan (the same sizes, the same work).
        for run in range(SCAN["runs"]):
            out.append(Probe(name if run == 0 else f"{name}-{run + 1}", "scan",
                             {**cfg, "seed": int(rng.integers(2**31))}, 2 * SCAN["Hkv"] * total * SCAN["d"] * 4))
        # The same cache and prefill without the decode steps: what making the cache costs in each reservation
        # (a mask table of max_len^2 entries, as gpt-fast's: 0.3 to 9 s of page faults in the larger, measured),
        # twice as well: the cheaper run counts.
        for run in range(SCAN["runs"]):
            out.append(Probe(f"{name}-base" + ("" if run == 0 else f"-{run + 1}"), "scan",
                             {**cfg, "decodes": 0, "seed": int(rng.integers(2**31))},
                             2 * SCAN["Hkv"] * live * SCAN["d"] * 4))
    return out


def copy_seconds(nbytes: int) -> float:
    """CPU seconds this machine takes to copy ``nbytes`` once (best of five after a first copy that maps the
    pages, measured here, now).

    CPU time, as the sandbox's figures are: on a loaded machine a copy's wall time includes the time it
    waits for a core (seen at 3x its CPU time), which would shrink every figure counted in copies.
    """
    import time

    if nbytes not in _COPY:
        src = np.ones(nbytes // 8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # page faults: the destination's first touch is not a copy's cost
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            np.copyto(dst, src)
            best = min(best, time.thread_time() - start)
        _COPY[nbytes] = best
    return _COPY[nbytes]


_COPY: dict = {}


def expected_probe_output(config: dict) -> np.ndarray:
    """The exact last decode output ``[Hq, d]`` of a probe, computed in float64 without the whole sequence."""
    key = tuple(sorted((k, v) for k, v in config.items() if k in ("Hkv", "G", "d", "live", "appends",
                                                                     "decodes", "seed", "total", "empty")))
    if key not in _EXPECTED:
        if len(_EXPECTED) > 16:
            _EXPECTED.clear()
        _EXPECTED[key] = _expected(config)
    return _EXPECTED[key]


_EXPECTED: dict = {}


def _expected(config: dict) -> np.ndarray:
    from grader.child.tasks import TAIL, probe_parts, probe_scales, probe_tokens

    Hkv, G, d = config["Hkv"], config["G"], config["d"]
    total, end = config["total"], config["live"] + config["appends"] + config["decodes"]
    if config.get("empty"):  # the cache made and left empty: no output
        return np.zeros(0)
    if not config["decodes"]:
        k, _ = probe_tokens(config["seed"], Hkv, d, total, end - TAIL, TAIL)
        return k[0].astype(np.float64).reshape(Hkv * TAIL, d)
    period = 512
    k_base, v_base, q = (x.astype(np.float64) for x in probe_parts(config["seed"], Hkv, d, period, Hkv * G))
    s = np.arange(end)
    a, b = probe_scales(s, total)
    out = np.zeros((Hkv * G, d))
    for j in range(Hkv):
        # Token s is base row s % period times a(s): score and weight through the period, O(S * G).
        base_scores = k_base[j] @ q[0, j * G:(j + 1) * G, 0].T / np.sqrt(d)  # [period, G]
        scores = base_scores[s % period] * a[:, None]  # [S, G]
        p = np.exp(scores - scores.max(axis=0))
        p /= p.sum(axis=0)
        weights = np.stack([np.bincount(s % period, weights=p[:, g] * b, minlength=period) for g in range(G)])
        out[j * G:(j + 1) * G] = weights @ v_base[j]
    return out


@functools.lru_cache(maxsize=1)
def installed_modules() -> frozenset[str]:
    """Top-level names of the standard library and of every installed distribution but the kit itself."""
    names = set(sys.stdlib_module_names)
    for top, dists in importlib.metadata.packages_distributions().items():
        if any(d != "kvkit" for d in dists):
            names.add(top)
    return frozenset(names)


def imported_names(workdir: str, files: list[str]) -> list[str]:
    """Module names the submission's Python files import, dotted as written (``matplotlib.pyplot``),
    read as syntax, never run. A submodule's first import can cost megabytes, so it is preimported too."""
    found = set()
    for rel in files:
        if not rel.endswith(".py"):
            continue
        try:
            with open(os.path.join(workdir, rel), encoding="utf-8", errors="replace") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, ValueError, RecursionError, MemoryError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return sorted(found)


def preimports(workdir: str, files: list[str]) -> dict:
    """Per session, the installed modules to import before any submission file runs: what the files
    that session loads name (so the submission's own imports cost it nothing in the memory probes),
    in trusted form. The NumPy session never loads the port; the port's may load ``kv_cache``."""
    installed = installed_modules()
    keep = lambda names: [n for n in names  # noqa: E731
                          if n.split(".")[0] in installed and all(p.isidentifier() for p in n.split("."))
                          and "__main__" not in n.split(".")]
    numpy_files = [f for f in files if f != "kv_cache_torch.py"]
    torch_files = [f for f in files if f in ("kv_cache_torch.py", "kv_cache.py")]
    return {"numpy": keep(imported_names(workdir, numpy_files)), "torch": keep(imported_names(workdir, torch_files))}


_INPUTS: dict = {}  # probe inputs written once per grading process: {config key: (k path, v path)}


def _inputs_dir() -> str:
    if "dir" not in _INPUTS:
        import atexit
        import tempfile

        # Memory-backed where the machine has it: ~300 MiB written per seed, read by every session.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        parent = os.environ.get("KVKIT_PROBE_DATA") or shm or tempfile.gettempdir()
        launch.sweep_stale(parent)
        _INPUTS["dir"] = tempfile.mkdtemp(prefix=f"kvkit-probe-data-{os.getpid()}-", dir=parent)
        os.chmod(_INPUTS["dir"], 0o755)
        atexit.register(launch.remove_tree, _INPUTS["dir"])
        # --jobs workers end without atexit; multiprocessing runs its finalizers there.
        from multiprocessing import util

        util.Finalize(None, launch.remove_tree, args=(_INPUTS["dir"],), exitpriority=10)
    return _INPUTS["dir"]


def job_data(plan: "Plan") -> tuple[dict, list, dict]:
    """``(hidden trials spec, probe trials, {dtype: path})``: every input of every trial, hidden or probe,
    in one flat file per dtype, written once per seed into the probe-data folder and mapped by the child."""
    key = (plan.seed, len(plan.trials))
    if key not in _INPUTS:
        flat = jobs.Flat()
        spec, _ = jobs.encode(plan.trials, flat)
        memo: dict = {}
        probes = {p.name: probe_trial(p.config, flat, memo) for p in plan.probes}
        paths = {}
        for dtype in flat.chunks:
            path = os.path.join(_inputs_dir(), f"data-{plan.seed}-{len(plan.trials)}-{dtype}.npy")
            flat.save(dtype, path)
            os.chmod(path, 0o644)
            paths[dtype] = path
        for old in [k for k in _INPUTS if k != "dir" and k != key]:
            for path in _INPUTS.pop(old)[2].values():
                try:
                    os.remove(path)
                except OSError:
                    pass
        _INPUTS[key] = (spec, probes, paths)
    return _INPUTS[key]


def probe_trial(config: dict, flat, memo: dict | None = None) -> dict:
    """A probe as a trial like the hidden ones: its inputs lie in the same flat float32 array (``flat``,
    a ``jobs.Flat``), the child runs it with the same code; only the sizes differ."""
    from grader.child.tasks import TAIL, probe_parts, probe_tokens

    Hkv, G, d, seed, total, live = (config[k] for k in ("Hkv", "G", "d", "seed", "total", "live"))
    if config.get("empty"):  # the cache alone: made, never appended to
        return {"name": "t", "B": 1, "Hkv": Hkv, "G": G, "d": d, "max_len": config["max_len"], "dtype": "float32",
                "steps": []}
    memo = {} if memo is None else memo
    key = (seed, Hkv, d, total, live)
    if key not in memo:  # probes with the same prefill (with and without appends, small and large reservation)
        k, v = probe_tokens(seed, Hkv, d, total, 0, live)
        memo[key] = (flat.ref(k, "float32"), flat.ref(v, "float32"))
        del k, v
    steps = [{"k": memo[key][0], "v": memo[key][1], "n_new": [live], "attend": False}]
    q = probe_parts(seed, Hkv, d, 512, Hkv * G)[2]
    for i in range(config["appends"] + config["decodes"]):
        k, v = probe_tokens(seed, Hkv, d, total, live + i, 1)
        step = {"k": flat.ref(k, "float32"), "v": flat.ref(v, "float32"), "n_new": [1]}
        if i < config["appends"]:
            step["attend"] = False
        else:
            step["q"] = flat.ref(q, "float32")
        steps.append(step)
    trial = {"name": "t", "B": 1, "Hkv": Hkv, "G": G, "d": d, "max_len": config["max_len"], "dtype": "float32",
             "steps": steps}
    if not config["decodes"]:
        trial["tail"] = TAIL
    return trial


def probe_task(plan: "Plan", backend: str, probe_name: str) -> str:
    """The opaque task name a probe (or ``"trials"``, the hidden trials) ran under in ``backend``'s session."""
    return f"{backend}:{plan.serial_names[probe_name]}"


def _session_job(plan: Plan, backend: str, timeout: float) -> dict:
    spec, probe_trials, paths = job_data(plan)
    tasks = [{"name": probe_task(plan, backend, "trials"), "kind": "trials", "backend": backend,
              "timeout": timeout, "checks": True}]
    for probe in plan.probes:
        tasks.append({"name": probe_task(plan, backend, probe.name), "kind": "trials", "backend": backend,
                      "timeout": timeout, "trials": [probe_trials[probe.name]]})
    # A random order and random names: no task can tell from its place whether it is measured.
    tasks.sort(key=lambda t: int(t["name"].split(":")[1]))
    if backend == "numpy" and plan.test_files:
        for name in plan.own_order:  # opaque names in a random order; the variants stay with the parent
            tasks.append({"name": name, "kind": "owntests", "secret": True,
                          "files": plan.test_files, "timeout": timeout, "parallel": True})
    preimport = list(plan.preimport.get(backend, [])) + (["torch"] if backend == "torch" else [])
    if backend == "numpy" and plan.test_files:
        preimport.append("pytest")
    return {"tasks": tasks, "trials": spec["trials"], "data": paths,
            "preimport": list(dict.fromkeys(preimport)), "width": 2,
            "cost_calls": plan.cost_calls if backend == "numpy" else []}


def run_sessions(workdir: str, plan: Plan, limits: launch.Limits, isolation, port: bool, meanwhile=None) -> dict:
    """``{"numpy": SessionResult, "torch": SessionResult | None}`` for the submission in ``workdir``.

    ``meanwhile``, a function of no argument, runs in this thread while the
    sessions run (the parent's own oracle work); its result is ``results["meanwhile"]``.
    """
    job_data(plan)  # written once, before the sessions share it
    files = {}
    import threading

    results = {}
    backends = ["numpy"] + (["torch"] if port else [])
    started = {b: threading.Event() for b in backends}

    def one(backend):
        job = _session_job(plan, backend, limits.wall_s)
        # The whole session's wall time: each task has its own timeout inside it.
        session_limits = launch.Limits(wall_s=limits.wall_s * 3 + 10 * len(job["tasks"]) ** 0.5,
                                       cpu_s=limits.cpu_s * 3, memory_bytes=limits.memory_bytes,
                                       file_bytes=limits.file_bytes, processes=limits.processes)
        try:
            own = plan.own_variants if backend == "numpy" else {}
            server = variants.Planted(own)
            results[backend] = launch.run_session(
                workdir, job, files, session_limits, isolation, shared=[_inputs_dir()], started=started[backend],
                secrets={task: "none" if v == "none" else protocol.WRAPPED for task, v in own.items()},
                serve=server.serve)
            results[backend].served = server.served
        except Exception as exc:  # noqa: BLE001 - reading what the child sent failed: the session says so
            results[backend] = launch.SessionResult(reason=f"the grader could not read this session's answers "
                                                           f"({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            started[backend].set()

    # The two sessions are independent (each its own cgroup; CPU time is per process): run them side by side.
    threads = [threading.Thread(target=one, args=(b,), daemon=True) for b in backends]
    for t in threads:
        t.start()
    if meanwhile is not None:
        for event in started.values():
            event.wait(60)
        with launch.FORK_LOCK:  # no fork while BLAS runs here (see launch.FORK_LOCK)
            results["meanwhile"] = meanwhile()
    for t in threads:
        t.join()
    return results


def trials_of(plan: Plan) -> list[Trial]:
    return plan.trials
