"""The grader, one folder per job; arrows point down only (``tests/test_layout.py`` checks it).

- ``batch/``: the command line, batches of hand-backs, class summaries, the Gradescope bundle.
- ``stages/``: one grading in the parent, in the order it flows: suite -> run -> compare -> criteria ->
  diagnose -> rubric -> report (``grade.py`` strings them together; ``layout.py`` lays a hand-back out).
- ``sandbox/``: isolation, cgroup limits and figures, the session with the child, the reaper.
- ``child/``: what runs inside the sandbox (standard library and NumPy only, nothing from the kit).
- ``inprocess/``: checks the notebook and the learner's steps run on the learner's own code, never on a
  hand-back.
- ``shipped/``: what the kit hands out (the starter bundle's contents, the cost calls), read by stages and
  the face alike.
"""
import os

HOME = os.path.dirname(os.path.abspath(__file__))  # rubric.toml and the Gradescope bundle's data files live here
KIT_ROOT = os.path.dirname(HOME)
