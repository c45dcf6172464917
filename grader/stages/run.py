"""Run a laid-out submission in the sandbox: one session per implementation, measured from outside.

The NumPy session runs the hidden trials, then the probes at realistic sizes
(each a process of its own, forked from the trusted zygote), then the
candidate's own tests, one process per variant. The port's session runs the
same trials and probes with torch tensors. Every figure a criterion decides on
comes from the kernel or the parent (``grader.sandbox.launch``), taken
between the marks each trials task makes; each probe also returns its last
outputs, which the parent checks. What the probes are is ``grader.stages.probes``.
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
from grader.stages import jobs, probes as probes_mod, variants
from grader.child import protocol
from grader.sandbox import launch
from grader.stages.suite import Trial

OWN_VARIANTS = ["none", mutants.CONTROL] + list(mutants.PLANTED)


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


def copy_seconds(nbytes: int) -> float:
    """CPU seconds this machine takes to copy ``nbytes`` once from main memory: the unit the growth figure counts
    an append's CPU time in.

    Timed here, once per process, on ``COPY_SAMPLE`` bytes (best of five after a first copy that maps the
    pages) and scaled to ``nbytes``: a sample that fits in the processor's last-level cache (32 MiB on this
    machine's EPYC) copies at two to three times the memory's rate, and timed at the cache's size the unit
    shrank with the probe's cache, so a small layout read a constant per-append overhead of 25 us as 0.2
    copies (0.1 from main memory). CPU time, as the sandbox's figures are: on a loaded machine a copy's wall
    time includes the time it waits for a core. ``grade.prepare_inputs`` times it before a batch forks its
    workers, which then share it (mapping the sample's fresh pages costs up to a second on a virtual machine).
    """
    import time

    if not _COPY:
        src = np.empty(COPY_SAMPLE // 8)
        src.fill(1.0)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # page faults: the destination's first touch is not a copy's cost
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            np.copyto(dst, src)
            best = min(best, time.thread_time() - start)
        _COPY["per_byte"] = best / COPY_SAMPLE
    return _COPY["per_byte"] * nbytes


COPY_SAMPLE = 64 << 20  # bytes: twice the last-level cache here, so that source and destination both miss it
_COPY: dict = {}


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


def job_data(plan: "Plan") -> tuple[dict, dict, dict, dict]:
    """``(hidden trials spec, {probe: trial list}, {dtype: path}, {probe: probes.Built})``: every input of every
    trial, hidden or probe, in one flat file per dtype, written once per seed into the probe-data folder and
    mapped by the child; the probes' queries and expected outputs stay here."""
    key = (plan.seed, len(plan.trials))
    if key not in _INPUTS:
        flat = jobs.Flat()
        spec, _ = jobs.encode(plan.trials, flat)
        memo: dict = {}
        built = {p.name: probes_mod.build(p, flat, memo) for p in plan.probes}
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
        _INPUTS[key] = (spec, {name: b.trials for name, b in built.items()}, paths, built)
    return _INPUTS[key]


def probe_task(plan: "Plan", backend: str, probe_name: str) -> str:
    """The opaque task name a probe (or ``"trials"``, the hidden trials) ran under in ``backend``'s session."""
    return f"{backend}:{plan.serial_names[probe_name]}"


def _session_job(plan: Plan, backend: str, timeout: float) -> dict:
    spec, probe_trials, paths, _ = job_data(plan)
    tasks = [{"name": probe_task(plan, backend, "trials"), "kind": "trials", "backend": backend,
              "timeout": timeout, "checks": True}]
    for probe in plan.probes:
        tasks.append({"name": probe_task(plan, backend, probe.name), "kind": "trials", "backend": backend,
                      "timeout": timeout, "trials": probe_trials[probe.name]})
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
            built = job_data(plan)[3]
            results[backend] = launch.run_session(
                workdir, job, files, session_limits, isolation, shared=[_inputs_dir()], started=started[backend],
                secrets={task: "none" if v == "none" else protocol.WRAPPED for task, v in own.items()},
                serve=server.serve,
                marks={probe_task(plan, backend, p.name): [b"", *built[p.name].marks, b""] for p in plan.probes})
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
