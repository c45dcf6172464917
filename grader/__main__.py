"""``python -m grader`` is ``kvkit grade``."""
import sys

from grader.batch.cli import main

sys.exit(main())
