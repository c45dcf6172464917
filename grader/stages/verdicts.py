"""The names of every verdict the grader gives, each defined once: a criterion's status, a tier, a report's status.

Each is a :class:`enum.StrEnum`: a member *is* its JSON name (``Status.PASS == "pass"``,
``json.dumps(Tier.WEAK) == '"Weak"'``, ``f"{Tier.HIRE}"`` is ``Hire``), so reports read back from JSON
files, rubric files and older code that still says ``"pass"`` compare equal to the members, and every
output is written byte for byte as with plain strings.

This module imports nothing of the kit: ``criteria``, ``rubric``, ``report`` and the batch tools all
read their names from here without an import cycle.
"""
from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A criterion's status in a report: ``pass``, ``fail``, ``not_attempted`` (the part was not handed in,
    or a call was refused with a clear error) or ``error`` (the check could not be made: "not measured" to
    a reader)."""

    PASS = "pass"
    FAIL = "fail"
    NOT_ATTEMPTED = "not_attempted"
    ERROR = "error"


class Tier(StrEnum):
    """The verdicts of a graded report, lowest first (the order ``Rubric.label`` and the cap compare in)."""

    WEAK = "Weak"
    HIRE = "Hire"
    STRONG_HIRE = "Strong Hire"


class ReportStatus(StrEnum):
    """Whether a report has a verdict: ``graded`` (a tier), ``not_graded`` (the hand-back cannot be graded:
    the reason says what to fix) or ``grader_error`` (the kit failed, not the candidate)."""

    GRADED = "graded"
    NOT_GRADED = "not_graded"
    GRADER_ERROR = "grader_error"


TIERS = [t.value for t in Tier]  # the tiers' names, lowest first, as plain strings (rubric files, audiences)
