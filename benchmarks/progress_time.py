"""Figure 6: how soon ``kvkit progress`` shows a learner the failure to fix.

``kvkit progress --dir COPY`` runs in a child process (``sys.executable -m
kvkit.cli``), as a learner runs it, and the time is taken from its start to the
line ``First failing check: ...`` (the current step's failure, printed as soon as
it is known), and to its exit. Two learners, each in a fresh copy of
``exercises/``:

- on step 1: the stubs as they come (nothing remembered yet);
- on step 2: ``KVCache`` filled in (the reference's, from ``solutions/``),
  ``gqa_attention`` still the stub. Its first run remembers step 2 as the current
  step; the runs timed are the ones after it, as each save of step 2 makes them.

Each is run ``rounds`` times; the figures are the slowest and the median.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXERCISES = REPO / "exercises"
SOLUTIONS = REPO / "solutions"
MARK = b"First failing check:"


def learner_copy(target: Path, step: int) -> Path:
    """A copy of exercises/ as a learner has it on ``step`` (1: the stubs; 2: KVCache written, the attention not)."""
    shutil.copytree(EXERCISES, target, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    if step == 2:
        reference = (SOLUTIONS / "kv_cache.py").read_text(encoding="utf-8")
        stub = (target / "kv_cache.py").read_text(encoding="utf-8")
        cut = reference.index("\ndef group_queries(")  # the reference up to its KVCache; the stub's attention
        (target / "kv_cache.py").write_text(reference[:cut] + "\n\n" + stub[stub.index("def gqa_attention("):],
                                            encoding="utf-8")
    elif step != 1:
        raise ValueError(f"no learner copy for step {step}")
    return target


def time_progress(folder: Path, timeout: float = 300.0) -> dict:
    """One ``kvkit progress --dir folder``: seconds to the first failing check's line and to exit, and the step it named."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvkit.cli", "progress", "--dir", str(folder)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = None
    step = None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if first is None and line.startswith(MARK):
                first = time.perf_counter() - start
                named = next((x for x in reversed(lines) if x.startswith("✘ Step ".encode())), b"")
                step = int(named.split()[2].rstrip(b":")) if named else None
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"first_message_s": first, "exit_s": time.perf_counter() - start, "step": step,
            "exit_code": proc.returncode}


def progress_figures(rounds: int = 3) -> dict:
    """The figures of both learners: ``progress_first_message_step{1,2}_s`` (the slowest of ``rounds``), medians,
    whole runs, and ``progress_first_message_s`` (the slower learner's), for the target."""
    out: dict = {"progress_rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="kvkit-bench-progress-") as tmp:
        for step in (1, 2):
            folder = learner_copy(Path(tmp) / f"step{step}", step)
            if step == 2:
                time_progress(folder)  # step 1 passes and step 2 fails: step 2 is remembered from now on
            runs = [time_progress(folder) for _ in range(rounds)]
            wrong = [r for r in runs if r["step"] != step or r["first_message_s"] is None]
            if wrong:
                out[f"progress_step{step}_error"] = f"a run did not name step {step} first: {wrong[0]}"
                out[f"progress_first_message_step{step}_s"] = None
                continue
            firsts = [r["first_message_s"] for r in runs]
            out[f"progress_first_message_step{step}_s"] = max(firsts)
            out[f"progress_first_message_step{step}_median_s"] = statistics.median(firsts)
            out[f"progress_whole_run_step{step}_s"] = statistics.median(r["exit_s"] for r in runs)
    measured = [out.get(f"progress_first_message_step{n}_s") for n in (1, 2)]
    out["progress_first_message_s"] = max(measured) if None not in measured else None
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(progress_figures(), indent=1))
