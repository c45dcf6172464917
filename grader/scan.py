"""A scan of the submission's source: supporting evidence, never a verdict.

It reads every ``.py`` file of the submission but its tests, before any of it
runs (code can rewrite itself). It points at lines that explain a measured mistake (``np.repeat`` beside a
measured repeat) and flags code that reaches for the harness's own tools
(tracemalloc, builtins, the ``__main__`` module, ``sys.modules``, frames): a
submission that does so gets its measured evidence marked untrustworthy, so
tampering can never earn a better tier than honest work.
"""
from __future__ import annotations

import os
import re

HINTS = {
    "kv_repeat": r"np\.repeat|np\.tile|repeat_interleave|\.repeat\(|broadcast_to\(.*\)\.copy|\.expand\(.*\)\.contiguous",
    "concat_growth": r"np\.concatenate|np\.append\(|np\.vstack|np\.hstack|torch\.cat\(|torch\.stack\(",
    "chunk_local_mask": r"is_causal\s*=\s*True",
}
# Reaching for the meters, the harness's frames or its output files, or hiding
# code from this scan (exec, eval, dynamic imports).
TAMPER = (r"tracemalloc|\bbuiltins\b|__builtins__|sys\.modules|import __main__|__main__\.|sys\._getframe|inspect\.(stack|currentframe)"
          r"|gc\.get_objects|perf_counter\s*=|_ORIGINAL|\batexit\b|results\.json|out\.npy|\.kvkit|os\.replace|os\.rename"
          r"|(?<![\w.])(exec|eval|compile)\(|__import__|importlib|\bctypes\b|\bsignal\.")


def _lines(workdir: str):
    """Every line of the submission's code, its own tests aside (they may well use tracemalloc)."""
    for root, _, files in os.walk(workdir):
        if ".kvkit" in root.split(os.sep):
            continue
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), workdir)
            if not name.endswith(".py") or name.startswith(("test_", "conftest")) or os.path.islink(os.path.join(root, name)):
                continue
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if not line.lstrip().startswith("#"):
                        yield rel, number, line.rstrip()


def scan(workdir: str) -> dict:
    """``{"hints": {mistake: [where...]}, "tamper": [where...]}`` with ``file:line`` places."""
    hints, tamper = {}, []
    for name, number, line in _lines(workdir):
        for mistake, pattern in HINTS.items():
            if re.search(pattern, line):
                hints.setdefault(mistake, []).append(f"{name}:{number}")
        if re.search(TAMPER, line):
            tamper.append(f"{name}:{number}: {line.strip()[:80]}")
    return {"hints": hints, "tamper": tamper}
