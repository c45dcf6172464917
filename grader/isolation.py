"""Isolation levels for the sandboxed child, best first, with a clean fallback.

``process``: the child process alone (``-I -S``, a private working directory, a
minimal environment, rlimits, a wall-clock kill of its process group).
Namespaces come on top where the machine allows them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PROCESS = "process (rlimits, -I -S, private directory)"


@dataclass
class Isolation:
    """The level reached, a command wrapper (None for the plain child) and a warning when weaker than full."""

    level: str
    wrap: Callable | None = None
    warning: str = ""


def choose(requested: str = "auto") -> Isolation:
    """The isolation for ``requested`` (auto, process or namespaces)."""
    return Isolation(PROCESS, None, "" if requested == "process" else
                     "Linux namespaces are not in use: the child can reach the network and see the file system")
