"""The figures a submission's ``cost.py`` is checked against: the calls the grader makes and what each returns.

In the kit they come from the cost model: ``grader/shipped/cost_table.py`` gives the calls, ``solutions/cost.py`` the
answers. The Gradescope bundle ships no reference solution, so ``kvkit gradescope`` computes them where the kit
is and writes them into the bundle as ``grader/bundle_costs.json``, which is read here in their place.
"""
from __future__ import annotations

import json
import os

from grader import HOME

BUNDLED = os.path.join(HOME, "bundle_costs.json")
_FIGURES: dict = {}


def computed() -> dict:
    """``{"calls": [[label, function name, args], ...], "expected": {label: value}}`` from the kit's cost model."""
    from grader.shipped import cost_table
    from solutions import cost

    calls = cost_table.cost_calls()
    return {"calls": calls, "expected": {label: getattr(cost, name)(*args) for label, name, args in calls}}


def figures() -> dict:
    """The bundle's figures (``BUNDLED``) where it carries them, else the kit's own (``computed``); read once.

    Raises:
        ValueError: ``BUNDLED`` is not the figures ``computed`` writes (every call with its expected value).
    """
    if "all" not in _FIGURES:
        if os.path.exists(BUNDLED):
            with open(BUNDLED) as f:
                data = json.load(f)
            calls, expected = data.get("calls"), data.get("expected")
            if not isinstance(calls, list) or not isinstance(expected, dict) \
                    or any(not isinstance(c, list) or len(c) != 3 or c[0] not in expected for c in calls):
                raise ValueError(f"{BUNDLED} does not hold the cost figures (calls, each with its expected value)")
            _FIGURES["all"] = {"calls": calls, "expected": expected}
        else:
            _FIGURES["all"] = computed()
    return _FIGURES["all"]
