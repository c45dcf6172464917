"""Timing on a shared, noisy machine: interleave the variants, keep the minimum.

Every figure of ``kvkit bench`` is a ratio of two times (or bytes per second
against a bandwidth) taken here, in one run: the variants being compared run in
turn, round after round, so a burst of load from a neighbour hits all of them
alike, and each keeps its fastest round (the least disturbed one). The median is
kept too, as a measure of the noise.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Timing:
    """Seconds per call of one variant over ``rounds`` interleaved rounds.

    Attributes:
        best: the fastest round, seconds (the figure the bench reports).
        median: the median round, seconds (how noisy the machine was).
        samples: every round, seconds, in the order they ran.
    """

    best: float
    median: float
    samples: list[float] = field(repr=False)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, *, warmup: int = 1,
                setup: dict[str, Callable[[], object]] | None = None,
                every: dict[str, int] | None = None, budget_s: float | None = None,
                min_rounds: int = 3) -> dict[str, Timing]:
    """Time each variant ``rounds`` times, one call of each per round, in turn.

    Args:
        variants: name -> a callable doing one unit of work (one decode step, one
            pass over an array). Its result is dropped after the clock stops.
        rounds: interleaved rounds; each variant keeps its fastest (``Timing.best``).
        warmup: untimed rounds first (first-touch page faults, lazy init, caches).
        setup: name -> an untimed callable run just before that variant each time
            (to undo the state a call leaves, e.g. a cache length).
        every: name -> k: that variant runs only every k-th round (a slow one whose
            figure needs less precision: it keeps its place in the interleaving).

    Returns:
        name -> ``Timing`` in seconds (wall clock, ``time.perf_counter``).
    """
    setup, every = setup or {}, every or {}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    began = None
    for round_ in range(warmup + rounds):
        if round_ == warmup:
            began = time.perf_counter()
        elif (budget_s is not None and round_ - warmup >= min_rounds
              and time.perf_counter() - began > budget_s):
            break
        for name, fn in variants.items():
            if round_ >= warmup and (round_ - warmup) % every.get(name, 1):
                continue
            if name in setup:
                setup[name]()
            start = time.perf_counter()
            result = fn()
            elapsed = time.perf_counter() - start
            del result
            if round_ >= warmup:
                samples[name].append(elapsed)
    return {name: Timing(min(s), statistics.median(s), s) for name, s in samples.items()}
