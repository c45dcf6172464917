"""``kvkit bench``: what the preallocated cache saves, and how close decode gets to the memory.

Each figure is a ratio or a fraction measured in one run on one machine (SPEC
section 8); the variants compared run interleaved, round after round, and each
keeps its fastest round (``benchmarks/timing.py``):

1. concatenation vs preallocation (``benchmarks/concat.py``): bytes copied,
   measured with tracemalloc, against ``solutions.cost.concat_bytes_copied``; time
   to generate n tokens with each cache;
2. a decode step of the NumPy reference and of the PyTorch port against the read
   bandwidth measured in the same run, against SDPA with ``enable_gqa=True`` and
   against repeat-then-attend (``benchmarks/decode.py``); beside them, the tuned
   copies of both (``benchmarks/tuned.py``) in the same rounds;
3. the same live length in a reservation of 8,192 and of 512;
4. grading: seconds per submission, submissions per minute with ``--jobs 2``
   (``benchmarks/grading.py``);
5. on a CUDA device, the port's bf16 decode against the device's copy bandwidth
   (``benchmarks/gpu_decode.py``; merged from its JSON with ``--gpu-json``);
6. the learner's feedback: seconds from ``kvkit progress`` to the current step's
   first failing check, on step 1 and on step 2 (``benchmarks/progress_time.py``).

Writes ``OUT/bench.json``, ``OUT/table.md``, ``OUT/concat.png`` and
``OUT/decode.png`` (``--out``, default ``bench-out``), and ``--json FILE``;
``--readme-assets`` also copies the plots into ``docs/img/``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = ("concat", "decode", "reservation", "grade", "gpu", "progress")

# (key, comparison, threshold, what it says): the targets for this CPU.
TARGETS = {
    "concat_bytes_ratio": ("within", 0.01, "bytes copied, measured / formula, within 1%"),
    "decode_torch_fraction_of_read_bw": (">=", 0.40, "PyTorch port at least 40% of the read bandwidth"),
    "decode_numpy_fraction_of_read_bw": (">=", 0.25, "NumPy reference at least 25% of the read bandwidth"),
    "decode_torch_vs_sdpa": (">=", 1.3, "PyTorch port at least 1.3x SDPA enable_gqa"),
    "decode_tuned_torch_fraction_of_read_bw": (">=", 0.50, "tuned PyTorch decode at least 50% of the read bandwidth"),
    "decode_tuned_torch_vs_sdpa": (">=", 1.5, "tuned PyTorch decode at least 1.5x SDPA enable_gqa"),
    "reservation_time_ratio": ("<=", 1.2, "8,192 over 512 reservation at most 1.2"),
    "progress_first_message_s": ("<=", 3.0, "kvkit progress shows the current step's failure within 3 s (steps 1, 2)"),
}

# The keys the issue asks for; each is in the JSON (None, with a reason, when not measured).
REQUIRED_KEYS = (
    "concat_bytes_measured", "concat_bytes_formula", "concat_time_ratio",
    "decode_numpy_fraction_of_read_bw", "decode_torch_fraction_of_read_bw",
    "decode_torch_vs_sdpa", "decode_repeat_vs_torch", "reservation_time_ratio",
    "grade_seconds_per_submission", "read_bw_bytes_per_s",
    "decode_tuned_torch_fraction_of_read_bw", "decode_tuned_torch_vs_sdpa",
)


def settings(quick: bool) -> dict:
    """Sizes and rounds: ``--quick`` (under a minute on 2 cores) or the full run (a few minutes).

    The decode and reservation shapes are the same in both (they define the
    figures); the quick run takes fewer rounds (decode: 8, or as many as start
    within 10 s, at least 3; progress: 1 instead of 3), a smaller read array, n up to
    2,048 instead of 4,096, and grades one batch of two examples (seconds per
    submission from the grader's own ``duration_s``) instead of one alone and then all.
    """
    if quick:
        return dict(concat_n=2048, concat_rounds=3, decode_rounds=8, decode_budget_s=10.0, read_bytes=512 * 2**20,
                    reservation_rounds=30, grade_batch=2, grade_single_run=False, progress_rounds=1)
    return dict(concat_n=4096, concat_rounds=3, decode_rounds=30, decode_budget_s=None, read_bytes=2**30,
                reservation_rounds=100, grade_batch=None, grade_single_run=True, progress_rounds=3)


def parser() -> argparse.ArgumentParser:
    """The command line of ``kvkit bench``."""
    p = argparse.ArgumentParser(prog="kvkit bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a run under a minute: fewer rounds, smaller n")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--out", metavar="DIR", default="bench-out",
                   help="directory for bench.json, table.md and the plots (default: bench-out)")
    p.add_argument("--readme-assets", action="store_true",
                   help="also copy concat.png and decode.png into docs/img/ (for README.md and docs/bench.md)")
    p.add_argument("--only", metavar="LIST", help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--gpu-json", metavar="FILE",
                   help="merge the JSON written by benchmarks/gpu_decode.py on a CUDA machine")
    p.add_argument("--grade-timeout", type=float, default=600.0, metavar="S",
                   help="seconds allowed to each grader run (default 600)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random K/V/q and of the grader (default 0)")
    return p


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def numpy_blas() -> dict:
    """NumPy's BLAS: name, and for the bundled OpenBLAS its core type and thread count."""
    import numpy as np

    from benchmarks.threads import openblas_core, openblas_threads

    info: dict = {}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["name"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        pass
    if openblas_threads() is not None:
        info["openblas_core"], info["openblas_threads"] = openblas_core(), openblas_threads()
    return info


def cpu_pressure() -> float | None:
    """Linux CPU pressure, ``some avg10`` from /proc/pressure/cpu: % of the last 10 s that a task
    waited for a core (how busy the neighbours were); ``None`` where not available."""
    try:
        with open("/proc/pressure/cpu", encoding="utf-8") as f:
            fields = dict(kv.split("=") for kv in f.readline().split()[1:])
        return float(fields["avg10"])
    except (OSError, KeyError, ValueError):
        return None


def environment() -> dict:
    """What the figures were measured on: CPU, core count, library versions, thread settings."""
    import numpy as np
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "numpy": np.__version__, "numpy_blas": numpy_blas(),
        "torch": torch.__version__, "torch_num_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                               "MKL_NUM_THREADS") if os.environ.get(k) is not None},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu_pressure_avg10_at_start": cpu_pressure(),
    }


def target_status(results: dict) -> dict:
    """Each target: the value, the threshold, and whether it was met (``None`` when not measured)."""
    out = {}
    for key, (op, threshold, text) in TARGETS.items():
        value = results.get(key)
        if value is None:
            met = None
        elif op == "within":
            met = abs(value - 1.0) <= threshold
        elif op == ">=":
            met = value >= threshold
        else:
            met = value <= threshold
        out[key] = {"value": value, "op": op, "threshold": threshold, "met": met, "target": text}
    return out


def decode_parts(results: dict, impl: str) -> dict[str, float] | None:
    """Seconds of a profiled decode step of ``impl`` (``numpy``/``torch``/``tuned_numpy``/``tuned_torch``) in four parts (see ``opprofile.breakdown``)."""
    from benchmarks.opprofile import breakdown

    ops = results.get("decode_profile", {}).get(impl)
    if not ops:
        return None
    return breakdown([tuple(o) for o in ops], results["decode_shape"]["live"])


PART_LABELS = {"qk": "Q·Kᵀ product", "pv": "P·V product", "passes": "scale/mask/softmax passes and copies",
               "other": "Python, validation, mask from lens"}


def limit_note(results: dict, impl: str) -> str | None:
    """Where a decode step of ``impl`` (``numpy``, ``torch``, ``tuned_numpy``, ``tuned_torch``) spends its time.

    The two products each read half the live K/V (K in the scores product, V in the
    weights product), so their GB/s says how close each gets to the bandwidth;
    ``passes`` are the scale, mask and softmax passes over the ``[B, Hkv, G, T, S]``
    scores and any copy; ``other`` is Python, validation and the mask from ``lens``.
    """
    parts = decode_parts(results, impl)
    if parts is None:
        return None
    half = results["decode_live_kv_bytes"] / 2
    total = sum(parts.values())
    bits = []
    for key in ("qk", "pv"):
        if parts[key]:
            bits.append(f"{PART_LABELS[key]} {parts[key] * 1e3:.1f} ms ({half / parts[key] / 1e9:.0f} GB/s)")
    if impl == "tuned_numpy":
        # The op profile follows arrays computed from K/V; the tuned NumPy step writes
        # its scores into a kept buffer, so its softmax passes land in ``other``.
        rest = parts["passes"] + parts["other"]
        bits.append(f"softmax passes on the kept scores buffer, Python, validation {rest * 1e3:.1f} ms")
    else:
        bits += [f"{PART_LABELS[k]} {parts[k] * 1e3:.1f} ms" for k in ("passes", "other")]
    return f"profiled step {total * 1e3:.1f} ms: " + ", ".join(bits)


def limiting_part(results: dict, impl: str) -> str:
    """The largest part of ``impl``'s profiled decode step, in words, with its share and (for a product) GB/s."""
    parts = decode_parts(results, impl)
    if not parts:
        return "no profile"
    key = max(parts, key=parts.get)
    share = parts[key] / sum(parts.values())
    text = f"{PART_LABELS[key]} {share:.0%} of the step"
    if key in ("qk", "pv"):
        rate = results["decode_live_kv_bytes"] / 2 / parts[key]
        text += f", reading {'K' if key == 'qk' else 'V'} at {rate / 1e9:.1f} GB/s " \
                f"({rate / results['read_bw_bytes_per_s']:.0%} of the read bandwidth)"
    return text


def _mark(status: dict, key: str) -> str:
    met = status.get(key, {}).get("met")
    return "" if key not in status else ("n/a" if met is None else ("met" if met else "MISSED"))


def table_rows(r: dict, status: dict) -> list[tuple[str, str, str, str]]:
    """``(figure, measured, target, met?)`` rows of the table, from the results dict."""
    rows = []
    if "concat_bytes_measured" in r and r.get("concat_n"):
        n = r["concat_n"]
        rows.append((f"1. bytes copied by concatenation, n = {n:,} (measured / formula)",
                     f"{r['concat_bytes_measured']:,} / {r['concat_bytes_formula']:,} B = "
                     f"{r['concat_bytes_ratio']:.5f}", "within 1%", _mark(status, "concat_bytes_ratio")))
        rows.append((f"1. time to generate n = {n:,}: concatenating / preallocated",
                     f"{r['concat_seconds']:.3f} s / {r['prealloc_seconds'] * 1e3:.1f} ms = "
                     f"{r['concat_time_ratio']:.0f}x", "", ""))
        rows.append(("1. growth of time with n (log-log slope)",
                     f"concatenating {r['concat_exponent']:.2f}, preallocated {r['prealloc_exponent']:.2f}",
                     "2 vs 1", ""))
    elif r.get("concat_error"):
        rows.append(("1. concatenation vs preallocation", r["concat_error"], "", ""))
    if r.get("read_bw_bytes_per_s"):
        rows.append(("2. read bandwidth (large array summed)",
                     f"{r['read_bw_bytes_per_s'] / 1e9:.1f} GB/s (numpy {r['read_bw_numpy_sum_bytes_per_s'] / 1e9:.1f}, "
                     f"torch {r['read_bw_torch_sum_bytes_per_s'] / 1e9:.1f}, {r['torch_num_threads']} threads)", "", ""))
        for impl, label, key in (("numpy", "NumPy reference", "decode_numpy_fraction_of_read_bw"),
                                 ("torch", "PyTorch port", "decode_torch_fraction_of_read_bw")):
            rows.append((f"2. decode step, {label}: live K/V bytes/s over read bandwidth",
                         f"{r[f'decode_{impl}_seconds'] * 1e3:.1f} ms, {r[f'decode_{impl}_bytes_per_s'] / 1e9:.1f} GB/s "
                         f"= {r[key]:.0%} (median of rounds {r[f'{key}_round_median']:.0%})",
                         f">= {TARGETS[key][1]:.0%}", _mark(status, key)))
        rows.append(("2. the same two steps with 1 thread each (OpenBLAS / torch)",
                     f"NumPy {r['decode_numpy_1thread_seconds'] * 1e3:.1f} ms = "
                     f"{r['decode_numpy_1thread_fraction_of_read_bw']:.0%}, port "
                     f"{r['decode_torch_1thread_seconds'] * 1e3:.1f} ms = "
                     f"{r['decode_torch_1thread_fraction_of_read_bw']:.0%}",
                     f"(default: {r['openblas_num_threads']} / {r['torch_num_threads']})", ""))
        rows.append(("2. SDPA enable_gqa time / port time",
                     f"{r['decode_sdpa_seconds'] * 1e3:.1f} ms / {r['decode_torch_seconds'] * 1e3:.1f} ms = "
                     f"{r['decode_torch_vs_sdpa']:.2f}x (SDPA at {r['decode_sdpa_fraction_of_read_bw']:.0%})",
                     ">= 1.3x", _mark(status, "decode_torch_vs_sdpa")))
        if r.get("decode_tuned_torch_seconds"):
            for impl, label in (("numpy", "NumPy"), ("torch", "PyTorch")):
                key = f"decode_tuned_{impl}_fraction_of_read_bw"
                rows.append((f"2. decode step, {label}: tuned (benchmarks/tuned.py) beside the reading copy",
                             f"tuned {r[f'decode_tuned_{impl}_seconds'] * 1e3:.1f} ms = {r[key]:.0%} "
                             f"(median of rounds {r[f'{key}_round_median']:.0%}), reading copy "
                             f"{r[f'decode_{impl}_seconds'] * 1e3:.1f} ms = {r[f'decode_{impl}_fraction_of_read_bw']:.0%}: "
                             f"{r[f'decode_tuned_{impl}_vs_{impl}']:.2f}x faster",
                             f">= {TARGETS[key][1]:.0%}" if key in TARGETS else "", _mark(status, key)))
            rows.append(("2. SDPA enable_gqa time / tuned PyTorch time",
                         f"{r['decode_sdpa_seconds'] * 1e3:.1f} ms / {r['decode_tuned_torch_seconds'] * 1e3:.1f} ms = "
                         f"{r['decode_tuned_torch_vs_sdpa']:.2f}x",
                         ">= 1.5x", _mark(status, "decode_tuned_torch_vs_sdpa")))
        rows.append(("2. repeat-then-attend time / port time",
                     f"{r['decode_repeat_seconds'] * 1e3:.1f} ms / {r['decode_torch_seconds'] * 1e3:.1f} ms = "
                     f"{r['decode_repeat_vs_torch']:.1f}x", "", ""))
    elif r.get("decode_error"):
        rows.append(("2. decode against the read bandwidth", r["decode_error"], "", ""))
    if r.get("reservation_time_ratio") is not None:
        live, small, large = r["reservation_live"], r["reservation_small"], r["reservation_large"]
        rows.append((f"3. live {live} keys, B={r['reservation_shape']['batch']}: reservation {large:,} / {small:,}, "
                     f"time ratio",
                     f"numpy {r['reservation_time_ratio_numpy']:.2f} "
                     f"({r['reservation_numpy_large_seconds'] * 1e3:.2f} / {r['reservation_numpy_small_seconds'] * 1e3:.2f} ms), "
                     f"torch {r['reservation_time_ratio_torch']:.2f} "
                     f"({r['reservation_torch_large_seconds'] * 1e3:.2f} / {r['reservation_torch_small_seconds'] * 1e3:.2f} ms)",
                     "<= 1.2", _mark(status, "reservation_time_ratio")))
    if "grade_seconds_per_submission" in r and (r.get("grade_jobs") or r.get("grade_error")):
        if r["grade_seconds_per_submission"] is None:
            rows.append(("4. grading", f"not measured: {r.get('grade_error')}", "", ""))
        else:
            spm = r.get("grade_submissions_per_minute")
            batch = (f"{spm:.1f} per minute ({r['grade_batch_size']} in {r['grade_batch_seconds']:.1f} s)"
                     if spm is not None else f"not measured: {r.get('grade_error')}")
            rows.append(("4. grading: seconds for one submission", f"{r['grade_seconds_per_submission']:.1f} s "
                         f"({r['grade_seconds_source']})", "", ""))
            rows.append((f"4. grading: submissions per minute, --jobs {r['grade_jobs']}", batch, "", ""))
    if r.get("gpu_decode_torch_seconds") is not None:
        rows.append((f"5. GPU ({r['gpu_device']}), bf16 decode B={r['gpu_shape']['batch']}, live "
                     f"{r['gpu_shape']['live']:,}: port / copy bandwidth",
                     f"{r['gpu_decode_torch_seconds'] * 1e3:.3f} ms, {r['gpu_decode_torch_bytes_per_s'] / 1e9:,.0f} GB/s "
                     f"= {r['gpu_decode_torch_fraction_of_copy_bw']:.0%} of {r['gpu_copy_bw_bytes_per_s'] / 1e9:,.0f} GB/s; "
                     f"SDPA / port {r['gpu_decode_torch_vs_sdpa']:.2f}x", "", ""))
    elif "gpu_error" in r:
        rows.append(("5. GPU decode (bf16)", r["gpu_error"], "", ""))
    for step in (1, 2):
        key = f"progress_first_message_step{step}_s"
        if r.get(key) is not None:
            rows.append((f"6. kvkit progress on step {step}: seconds to the first failing check (whole run)",
                         f"{r[key]:.2f} s, slowest of {r['progress_rounds']} (median "
                         f"{r[f'progress_first_message_step{step}_median_s']:.2f} s; whole run "
                         f"{r[f'progress_whole_run_step{step}_s']:.1f} s)", "<= 3 s",
                         _mark(status, "progress_first_message_s")))
        elif r.get(f"progress_step{step}_error"):
            rows.append((f"6. kvkit progress on step {step}", r[f"progress_step{step}_error"], "", ""))
    return rows


def notes(r: dict, status: dict) -> list[str]:
    """Lines under the table: where the decode time goes, and what limits each missed target."""
    lines = []
    for impl, label in (("numpy", "NumPy reference"), ("torch", "PyTorch port"),
                        ("tuned_numpy", "Tuned NumPy"), ("tuned_torch", "Tuned PyTorch")):
        note = limit_note(r, impl)
        if note:
            lines.append(f"{label} decode step, {note}")
    why = {
        "decode_torch_fraction_of_read_bw": lambda: "limited by the " + limiting_part(r, "torch"),
        "decode_numpy_fraction_of_read_bw": lambda: "limited by the " + limiting_part(r, "numpy"),
        "decode_torch_vs_sdpa": lambda: f"SDPA ran at {r['decode_sdpa_fraction_of_read_bw']:.0%} of the read "
                                        f"bandwidth; the port is limited by the " + limiting_part(r, "torch"),
        "decode_tuned_torch_fraction_of_read_bw": lambda: "limited by the " + limiting_part(r, "tuned_torch"),
        "decode_tuned_torch_vs_sdpa": lambda: f"SDPA ran at {r['decode_sdpa_fraction_of_read_bw']:.0%} of the read "
                                              f"bandwidth; the tuned step is limited by the "
                                              + limiting_part(r, "tuned_torch"),
        "reservation_time_ratio": lambda: "the large reservation costs more than the live keys explain "
                                          "(a scan past lens.max(), or strided reads)",
        "concat_bytes_ratio": lambda: "tracemalloc saw allocations other than the concatenations",
        "progress_first_message_s": lambda: "one step's pytest run (its start-up and the step's checks) took that "
                                            "long: a busy machine, or a slow file system",
    }
    for key, s in status.items():
        if s["met"] is False:
            lines.append(f"MISSED: {s['target']} (measured {s['value']:.3g}): {why[key]()}.")
    return lines


def print_table(rows, lines, title: str) -> None:
    """The table and notes, with rich."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    table.add_column("figure")
    table.add_column("measured", overflow="fold")
    table.add_column("target")
    table.add_column("")
    for figure, measured, target, mark in rows:
        style = "red" if mark == "MISSED" else ("green" if mark == "met" else None)
        table.add_row(figure, measured, target, mark, style=style)
    console = Console(width=max(120, Console().width))
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)


def markdown(rows, lines, title: str) -> str:
    """The table and notes as Markdown (for README.md and docs/bench.md)."""
    out = [f"**{title}**", "", "| figure | measured | target | |", "| --- | --- | --- | --- |"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    out += [""] + [f"- {line}" for line in lines]
    return "\n".join(out) + "\n"


def _downsample(series: dict, points: int = 256) -> dict:
    n = len(series["n"])
    idx = sorted(set(list(range(0, n, max(1, n // points))) + [n - 1]))
    return {k: [v[i] for i in idx] for k, v in series.items()}


def run(args) -> dict:
    """Run the chosen figures; the merged results dict (see ``REQUIRED_KEYS`` and docs/bench.md)."""
    only = set(FIGURES) if not args.only else {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(FIGURES)
    if unknown:
        raise SystemExit(f"kvkit bench: unknown figure(s) in --only: {', '.join(sorted(unknown))}")
    cfg = settings(args.quick)
    results: dict = {"schema": "kvkit.bench/1", "quick": args.quick, "settings": cfg, "machine": environment()}
    results.update({key: None for key in REQUIRED_KEYS})
    for figure in FIGURES:
        if figure not in only:
            results[f"{figure}_error"] = "not run (--only)"
    started = time.perf_counter()

    if "concat" in only:
        from benchmarks.concat import concat_figures

        _log(f"1. concatenation vs preallocation, n up to {cfg['concat_n']:,}")
        results.update(concat_figures(cfg["concat_n"], cfg["concat_rounds"], seed=args.seed))
    if "decode" in only:
        from benchmarks.decode import DecodeShape, decode_figures

        _log(f"2. decode step against the read bandwidth, {cfg['decode_rounds']} rounds")
        results.update(decode_figures(DecodeShape(), cfg["decode_rounds"], cfg["read_bytes"], seed=args.seed,
                                      budget_s=cfg["decode_budget_s"]))
    if "reservation" in only:
        from benchmarks.decode import reservation_figures

        _log("3. live length vs reservation")
        results.update(reservation_figures(cfg["reservation_rounds"], seed=args.seed))
    if "grade" in only:
        from benchmarks.grading import grade_figures

        _log("4. grading (python -m grader)")
        results.update(grade_figures(cfg["grade_batch"], jobs=2, timeout=args.grade_timeout, seed=args.seed,
                                     single_run=cfg["grade_single_run"]))
    if "gpu" in only:
        results.update(gpu_figures(args.gpu_json))
    if "progress" in only:
        from benchmarks.progress_time import progress_figures

        _log(f"6. kvkit progress: time to the first failing check on steps 1 and 2, {cfg['progress_rounds']} round(s)")
        results.update(progress_figures(cfg["progress_rounds"]))
    results["targets"] = target_status(results)
    results["bench_seconds"] = time.perf_counter() - started
    results["machine"]["cpu_pressure_avg10_at_end"] = cpu_pressure()
    return results


def gpu_figures(gpu_json: str | None) -> dict:
    """Figure 5: from ``--gpu-json`` if given, else measured here when CUDA is present, else the reason."""
    if gpu_json:
        data = json.loads(Path(gpu_json).read_text(encoding="utf-8"))
        if data.get("cuda") and data.get("gpu_decode_torch_seconds") is not None:
            return {**data, "gpu_source": str(gpu_json)}
        return {"gpu_error": f"{gpu_json} holds no CUDA measurement ({data.get('reason', 'dry run')})"}
    from benchmarks import gpu_decode

    if not gpu_decode.cuda_available():
        return {"gpu_error": "no CUDA device here: run python benchmarks/gpu_decode.py --json FILE on one, "
                             "then kvkit bench --gpu-json FILE"}
    _log("5. GPU decode (bf16)")
    return {**gpu_decode.measure("cuda"), "cuda": True, "gpu_source": "measured in this run"}


def write_outputs(results: dict, args) -> list[Path]:
    """Write bench.json, table.md and the plots into ``--out`` (and ``--json``, ``--readme-assets``)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if results.get("series"):
        from benchmarks.plots import plot_concat

        written.append(plot_concat(results, out / "concat.png"))
    if results.get("decode_torch_bytes_per_s"):
        from benchmarks.plots import plot_decode

        written.append(plot_decode(results, out / "decode.png"))
    data = dict(results)
    if data.get("series"):
        data["series"] = _downsample(data["series"])
    text = json.dumps(data, indent=2, default=float) + "\n"
    (out / "bench.json").write_text(text, encoding="utf-8")
    written.append(out / "bench.json")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text, encoding="utf-8")
        written.append(Path(args.json))
    if args.readme_assets:
        img = REPO / "docs" / "img"
        img.mkdir(parents=True, exist_ok=True)
        for name in ("concat.png", "decode.png"):
            if (out / name).exists():
                shutil.copyfile(out / name, img / name)
                written.append(img / name)
    return written


def main(argv: list[str] | None = None) -> int:
    """``kvkit bench [--quick] [--json FILE] [--out DIR] ...``: 0 when it ran (targets missed or not), 2 on usage."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        results = run(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise
    status = results["targets"]
    m = results["machine"]
    blas = m["numpy_blas"]
    title = (f"kvkit bench{' --quick' if args.quick else ''}: {m['cpu']}, {m['cpu_count']} cores, "
             f"torch {m['torch']} ({m['torch_num_threads']} threads), numpy {m['numpy']}"
             + (f" (OpenBLAS {blas['openblas_core']}, {blas['openblas_threads']} threads)"
                if "openblas_threads" in blas else ""))
    rows, lines = table_rows(results, status), notes(results, status)
    if m.get("cpu_pressure_avg10_at_start") is not None:
        lines.append(f"CPU pressure (share of the last 10 s a task waited for a core): "
                     f"{m['cpu_pressure_avg10_at_start']:.0f}% at the start, {m['cpu_pressure_avg10_at_end']:.0f}% "
                     f"at the end; timings are the fastest of interleaved rounds.")
    print_table(rows, lines, title)
    written = write_outputs(results, args)
    (Path(args.out) / "table.md").write_text(markdown(rows, lines, title), encoding="utf-8")
    _log(f"done in {results['bench_seconds']:.0f} s; wrote {', '.join(map(str, written))}, "
         f"{Path(args.out) / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
