"""``kvkit``: one command, one subcommand per job of the kit.

Each subcommand's module is imported only when it runs, so ``kvkit progress``
does not pay for torch and ``kvkit grade`` does not need matplotlib.
"""
from __future__ import annotations

import sys

COMMANDS = {
    "grade": ("grader.batch.cli", "main", "grade submissions (no argument: the bundled examples)"),
    "gradescope": ("grader.batch.gradescope", "main", "build a Gradescope autograder bundle"),
    "progress": ("kvkit.progress", "progress_main", "show the learner's steps, done or pending"),
    "hint": ("kvkit.progress", "hint_main", "the next hint for the current step"),
    "starter": ("kvkit.starter", "main", "build the candidate's take-home bundle"),
    "bench": ("benchmarks.bench", "main", "measure the costs and speeds against the physical limit"),
    "cost": ("grader.shipped.cost_table", "print_cost_table", "print the cost table: why the cache is allocated once"),
    "check-kit": ("grader.batch.check_kit", "main", "check the kit's own data against its code (maintainers)"),
}


def usage() -> str:
    lines = ["usage: kvkit COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``kvkit COMMAND ARGS``; exit 2 on an unknown command."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kvkit: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    import importlib

    func = getattr(importlib.import_module(module_name), func_name)
    result = func() if name == "cost" else func(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
