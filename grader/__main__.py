"""``python -m grader`` is ``kvkit grade``."""
import sys

from grader.cli import main

sys.exit(main())
