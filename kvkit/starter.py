"""``kvkit starter OUTDIR [--zip] [--hints] [--force]``: the candidate's take-home bundle, built and checked.

What goes in, and the checks that nothing private does, are ``grader/shipped/bundle.py``'s.

    kvkit starter ~/take-home            then: cd ~/take-home && python progress.py
    kvkit starter ~/take-home --zip      also writes ~/take-home.zip
    kvkit starter ~/gqa --hints          a learner's copy, hints included
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.shipped.bundle import BuildError, build, write_zip


def main(argv: list[str] | None = None) -> int:
    """``kvkit starter OUTDIR [--zip] [--hints] [--force]``: exit 0 when built, 2 when not."""
    parser = argparse.ArgumentParser(prog="kvkit starter", description="Build the candidate's take-home bundle.")
    parser.add_argument("outdir", help="the directory to create (must not exist, or be empty)")
    parser.add_argument("--zip", action="store_true", help="also write OUTDIR.zip, ready to send")
    parser.add_argument("--hints", action="store_true",
                        help="keep the hints in steps.toml (they come close to the answers: for learners, not candidates)")
    parser.add_argument("--force", action="store_true", help="replace an earlier bundle in OUTDIR")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    outdir = Path(args.outdir)
    try:
        written = build(outdir, hints=args.hints, force=args.force)
    except BuildError as exc:
        print(f"kvkit starter: {exc}", file=sys.stderr)
        return 2
    outdir = outdir.expanduser().resolve()
    print(f"Wrote the take-home bundle to {outdir} ({len(written)} files, "
          f"{'with' if args.hints else 'without'} hints).")
    if args.zip:
        print(f"Wrote {write_zip(outdir)}")
    who = "A learner" if args.hints else "The candidate"
    print(f"{who} starts with: cd {outdir} && pip install -r requirements.txt && python progress.py "
          f"(step 6 needs torch: see requirements.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
