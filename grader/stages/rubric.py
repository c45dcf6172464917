"""The rubric: points per criterion and the Weak / Hire / Strong Hire rules, read from TOML.

The default is ``grader/rubric.toml`` (the rubric (README, "Grading")); an instructor passes a
copy with other points or tiers. The tier rule:

* Weak if the NumPy implementation has a mistake listed in ``weak_mistakes``,
  or any criterion of tier "Hire" does not pass.
* Strong Hire if, besides, every criterion of tier "Strong Hire" passes.
* Otherwise Hire. A mistake named in the PyTorch port caps the tier at
  ``port_mistake_cap``.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from grader import HOME
from grader.stages.registry import REGISTRY
from grader.stages.inert import join, shorten, strip
from grader.stages.verdicts import TIERS, Status, Tier  # noqa: F401 - Tier and TIERS re-exported: their old home

DEFAULT = os.path.join(HOME, "rubric.toml")
REASON_LIMIT = 500  # a tier reason lists whole checks up to this many characters, then "and N more"
CRITERION_TIERS = (Tier.HIRE, Tier.STRONG_HIRE, "none")  # what a criterion is needed for; "none": points only
AUDIENCES = ("hiring", "class")
DEFAULT_AUDIENCES = {"hiring": list(TIERS), "class": ["Needs work", "Meets expectations", "Exceeds expectations"]}


class RubricError(ValueError):
    """A rubric file that cannot be used (unreadable, unknown tier, missing points)."""


@dataclass
class Rubric:
    """A rubric, as :func:`load` reads it: points and the tier each criterion is needed for, and the tier rules.

    ``criteria``: id -> ``{"title", "points", "tier"}`` (``tier`` one of :data:`CRITERION_TIERS`), in the
    file's order. ``weak_mistakes``: mistakes of the NumPy part that make the verdict Weak alone.
    ``port_mistake_cap``: the tier a mistake named in the port caps the verdict at. ``max_score``: the
    criteria's points added up. ``weak_when_wrong``: criteria whose wrong outputs make the verdict Weak.
    ``audiences``: name -> the words it reads for :data:`TIERS`, in order.
    """

    criteria: dict  # id -> {"title", "points", "tier"}
    weak_mistakes: list
    port_mistake_cap: Tier
    max_score: float
    weak_when_wrong: list = field(default_factory=list)  # criteria whose wrong outputs make the verdict Weak
    audiences: dict = field(default_factory=lambda: dict(DEFAULT_AUDIENCES))  # name -> labels of TIERS

    def title(self, cid: str) -> str:
        """The criterion's title (from the registry, ``grader.stages.registry.REGISTRY``)."""
        return REGISTRY[cid].title if cid in REGISTRY else cid

    def label(self, tier: str | None, audience: str = "hiring") -> str | None:
        """What ``audience`` reads for ``tier`` (one of ``TIERS``; None stays None)."""
        if tier is None:
            return None
        names = self.audiences.get(audience) or self.audiences["hiring"]
        return names[TIERS.index(tier)]

    def lowest_tier(self) -> Tier:
        """The tier of a submission that meets nothing (the first of ``TIERS``)."""
        return Tier(TIERS[0])

    def left_out(self, statuses: dict, unjudgeable: set | frozenset = frozenset()) -> set[str]:
        """The optional criteria (tier "none") that count neither for nor against the score: each not
        attempted (``statuses``: id -> :class:`Status`), or in ``unjudgeable`` (it ran, but no figure can
        judge it: a live length whose cache's making outweighs the decode steps). Their points leave the
        total, and the other criteria's are scaled up to ``max_score`` (``report.scaled_points``)."""
        return {cid for cid, spec in self.criteria.items() if spec["tier"] == "none"
                and (statuses.get(cid) == Status.NOT_ATTEMPTED or cid in unjudgeable)}

    def relabel(self, text: str, audience: str = "hiring") -> str:
        """``text`` (a tier reason, written with the tier ids) in ``audience``'s words."""
        import re

        names = self.audiences.get(audience) or self.audiences["hiring"]
        table = dict(zip(TIERS, names))
        pattern = "|".join(re.escape(t) for t in sorted(TIERS, key=len, reverse=True))
        return re.sub(rf"\b({pattern})\b", lambda m: table[m.group(1)], text)

    def tier(self, statuses: dict, numpy_mistakes: list, port_mistakes: list,
             evidence: dict | None = None, silent: set | frozenset = frozenset()) -> tuple[Tier, str]:
        """``(tier, reason)`` from criterion statuses and the mistakes named in each section.

        ``evidence`` (criterion id -> text) lets the reason say why a check
        was not measured (status "error") rather than calling it "not passed". ``silent``: the criteria
        whose failing steps returned wrong outputs rather than raising; one of
        ``weak_when_wrong`` among them makes the verdict Weak whatever its
        pattern (a clear refusal does not).
        """
        weak = [m for m in numpy_mistakes if m in self.weak_mistakes]
        missing_hire = [c for c, spec in self.criteria.items()
                        if spec["tier"] == Tier.HIRE and statuses.get(c) != Status.PASS]
        if weak:
            return Tier.WEAK, (f"{'mistakes that each decide' if len(weak) > 1 else 'a mistake that decides'} "
                               f"the verdict alone: {', '.join(weak)}")
        evidence = evidence or {}

        def part(c):
            """One criterion that did not pass: its title and state, and for a check not measured or not
            attempted what it saw, cut at a word with its brackets closed."""
            if statuses.get(c) == Status.ERROR:
                return f"{self.title(c)} (not measured: {shorten(strip(evidence.get(c) or 'no evidence'), 160)})"
            if statuses.get(c) == Status.NOT_ATTEMPTED:  # what the check saw: "no cost.py", "... refused ..."
                seen = strip(evidence.get(c) or "")
                return f"{self.title(c)} (not attempted: {shorten(seen, 100)})" if seen else \
                    f"{self.title(c)} (not attempted)"
            return self.title(c)

        def parts(ids):
            # Checks that failed first: they are the cause; the checks that could not be measured say why.
            return join([part(c) for c in sorted(ids, key=lambda c: statuses.get(c) == Status.ERROR)], REASON_LIMIT)
        if missing_hire:
            return Tier.WEAK, f"not every Hire check passes: {parts(missing_hire)}"
        wrong = [c for c in self.weak_when_wrong if c in silent and statuses.get(c) == Status.FAIL]
        if wrong:
            return Tier.WEAK, ("silently wrong: " + "; ".join(self.title(c) for c in wrong)
                               + " returns wrong outputs (no clear refusal), which decides the verdict alone")
        missing_strong = [c for c, spec in self.criteria.items()
                          if spec["tier"] == Tier.STRONG_HIRE and statuses.get(c) != Status.PASS]
        tier, reason = (Tier.HIRE, f"not every Strong Hire check passes: {parts(missing_strong)}") if missing_strong \
            else (Tier.STRONG_HIRE, "every check that decides the tier passes")
        reported = [m for m in numpy_mistakes if m not in self.weak_mistakes]
        if tier == Tier.STRONG_HIRE and reported:  # a performance finding (max_len_scan): said, never a tier
            reason += f"; {', '.join(reported)} is reported and decides no tier"
        capping = list(port_mistakes)
        if capping:
            cap = f"port: {', '.join(capping)} (caps the tier at {self.port_mistake_cap})"
            if TIERS.index(tier) > TIERS.index(self.port_mistake_cap):
                tier, reason = self.port_mistake_cap, f"capped by the PyTorch {cap}"
            elif TIERS.index(tier) < TIERS.index(self.port_mistake_cap):
                reason += f"; {cap[:-1]}, a tier above this one)"
            else:
                reason += f"; {cap}"
        return tier, reason


def load(path: str | None = None) -> Rubric:
    """Read a rubric file (default: the kit's).

    Raises:
        RubricError: the file is missing or malformed, a tier is not one of
            Hire / Strong Hire / none, or points are not numbers.
    """
    path = path or DEFAULT
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RubricError(f"rubric {path}: {exc}") from exc
    criteria = data.get("criteria")
    if not isinstance(criteria, dict) or not criteria:
        raise RubricError(f"rubric {path}: no [criteria.*] tables")
    unknown = sorted(set(criteria) - set(REGISTRY))
    missing = sorted(set(REGISTRY) - set(criteria))
    if unknown or missing:
        raise RubricError(f"rubric {path}: " + "; ".join(
            ([f"unknown criteria {', '.join(unknown)}"] if unknown else [])
            + ([f"no points for {', '.join(missing)}"] if missing else []))
            + f" (the criteria are: {', '.join(REGISTRY)})")
    for cid, spec in criteria.items():
        if not isinstance(spec.get("points"), (int, float)) or spec.get("tier") not in CRITERION_TIERS:
            raise RubricError(f"rubric {path}: criterion {cid} needs numeric points and tier Hire, Strong Hire or none")
        if "title" in spec:
            raise RubricError(f"rubric {path}: criterion {cid} has a title; titles come from the kit's registry "
                              "(grader/stages/criteria.py), a rubric gives only points and tiers")
        spec["title"] = REGISTRY[cid].title
    tiers = data.get("tiers", {})
    cap = tiers.get("port_mistake_cap", Tier.HIRE)
    if cap not in TIERS:
        raise RubricError(f"rubric {path}: port_mistake_cap must be one of {TIERS}, got {cap!r}")
    total = float(sum(spec["points"] for spec in criteria.values()))
    max_score = float(data.get("max_score", total))
    if abs(max_score - total) > 1e-9:
        raise RubricError(f"rubric {path}: the criteria's points add up to {total:g}, not max_score = {max_score:g}; "
                          "change one or the other")
    audiences = dict(DEFAULT_AUDIENCES)
    for name, labels in (data.get("audiences") or {}).items():
        if not (isinstance(labels, list) and len(labels) == len(TIERS) and all(isinstance(x, str) for x in labels)):
            raise RubricError(f"rubric {path}: audiences.{name} must list {len(TIERS)} names (for {', '.join(TIERS)})")
        audiences[name] = labels
    silent = list(tiers.get("weak_when_wrong", []))
    if set(silent) - set(criteria):
        raise RubricError(f"rubric {path}: weak_when_wrong names unknown criteria {sorted(set(silent) - set(criteria))}")
    return Rubric(criteria, list(tiers.get("weak_mistakes", [])), Tier(cap), max_score, weak_when_wrong=silent,
                  audiences=audiences)
