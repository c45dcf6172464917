"""The one table of bounds the structural criteria are judged by.

Each bound is a ratio of two kernel figures of the same grading run, with its
rule in one line, the side a mistake lies on, and the margin: the bundled
examples stay on their side of the limit by at least that factor under every
seed the suite tries (``tests/test_bounds.py``). How each was measured, and
why the limit sits where it does, is in docs/measurement.md.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """A limit on one measured ratio: at or above ``limit`` is the mistake's side."""

    id: str
    limit: float
    margin: float  # honest figures stay at or below limit / margin, mistaken ones at or above limit * margin
    rule: str

    def crossed(self, figure: float) -> bool:
        return figure >= self.limit


BOUNDS = {b.id: b for b in (
    Bound("repeat_per_head", 0.3, 1.5,
          "an attention call's extra peak above its twin's at G = 1, in live K/V per extra query head per KV head "
          "(G - 1): a repeat of K and V adds 1, of K alone 0.5; scores add G T / 2d"),
    Bound("call_held", 4.5, 1.3,
          "an attention call's extra peak in live K/V, against max(4.5, 0.6 G): memory per query head whatever the "
          "twin holds (honest calls hold working copies of K and V: up to 3)"),
    Bound("task_held", 7.5, 1.2,
          "the peak of a decode process at 8 KV heads and d = 128, in live K/V, against max(7.5, 1 + 0.4 G): memory "
          "held for K/V per query head whatever the heads (a cache read in place holds about 2, a mask table 1 more)"),
    Bound("growth_held", 0.6, 1.5,
          "in a run of one-token appends, a part's peak above its end, in live K (or V) at its start: the old "
          "buffer held beside its copy, K's and V's one after the other (a cache written in place frees nothing)"),
    Bound("growth_cpu", 0.3, 1.5,
          "CPU time per one-token append, in copies of the K/V the cache holds (the median stretch; a copy from main "
          "memory timed by the parent in the same run): a copy on every append is 1, wherever it is made (another process too)"),
    Bound("scan", 3.0, 1.5,
          "CPU time of the same decode steps in a reservation 8 to 11 times larger against a little above the live "
          "length, the cheaper of two runs each: attention over max_len"),
)}


def call_held_limit(G: int) -> float:
    """``call_held``'s limit at group size ``G`` (live K/V): a repeat of K and V adds G."""
    return max(BOUNDS["call_held"].limit, 0.6 * G)


def task_held_limit(G: int) -> float:
    """``task_held``'s limit at group size ``G`` (live K/V)."""
    return max(BOUNDS["task_held"].limit, 1 + 0.4 * G)
