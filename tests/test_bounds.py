"""Every bundled example stays on its side of each bound by the bound's margin (``catalogue/rules.py``).

``margin_violations`` reads the figures a report carries (``report["figures"]``, by bound) beside the
mistakes the example is expected to get: a figure whose mistake the example makes must reach the limit
times the margin (at least one of the mistake's figures), every other figure must stay at the limit over
the margin. tests/test_grader.py applies it to the examples' reports (seed 11 in `make test`, four more
seeds in `make test-slow`); here it is checked against reports made up to cross each side.
"""
from __future__ import annotations

import pytest

from catalogue.rules import BOUNDS

# The mistake each bound's figures name (call_held and task_held fail unnamed, but only a repeat reaches them).
MISTAKE = {"repeat_per_head": "kv_repeat", "call_held": "kv_repeat", "task_held": "kv_repeat",
           "growth_held": "concat_growth", "growth_cpu": "concat_growth", "scan": "max_len_scan"}


def margin_violations(report: dict, expected_mistakes) -> list[str]:
    """What in ``report``'s figures sits too close to a limit, or on the wrong side, for an example
    expected to make ``expected_mistakes`` (its NumPy part's)."""
    figures = dict(report.get("figures") or {})
    if "concat_growth" in expected_mistakes:
        figures.pop("scan", None)  # each decode step appends: copies slow the larger reservation too
    out = []
    for mistake in sorted(set(MISTAKE.values())):
        ids = [b for b, m in MISTAKE.items() if m == mistake and b in figures]
        if mistake in expected_mistakes:
            if ids and not any(figures[b] >= BOUNDS[b].limit * BOUNDS[b].margin for b in ids):
                out.append(f"{mistake}: {', '.join(f'{b} {figures[b]}' for b in ids)}: none past its limit "
                           f"by its margin")
        else:
            out += [f"{b} {figures[b]} is within its margin of {BOUNDS[b].limit} (or past it)" for b in ids
                    if figures[b] > BOUNDS[b].limit / BOUNDS[b].margin]
    return out


@pytest.mark.parametrize("figures,mistakes,bad", [
    ({"repeat_per_head": 0.05, "growth_held": 0.1, "growth_cpu": 0.03, "scan": 1.0}, [], False),
    ({"repeat_per_head": 0.25, "scan": 1.0}, [], True),  # honest, but too near the repeat limit
    ({"repeat_per_head": 1.0}, ["kv_repeat"], False),
    ({"repeat_per_head": 0.35}, ["kv_repeat"], True),  # named, but only just
    ({"growth_held": 0.05, "growth_cpu": 5.0}, ["concat_growth"], False),  # one figure by its margin suffices
    ({"growth_held": 0.05, "growth_cpu": 0.05}, ["concat_growth"], True),  # expected but not shown
    ({"scan": 6.0}, ["max_len_scan"], False),
])
def test_margins_are_checked_both_ways(figures, mistakes, bad):
    assert bool(margin_violations({"figures": figures}, mistakes)) == bad
