"""nbgrader configuration for the kit's classroom notebook (run nbgrader from this directory).

Course layout (nbgrader's defaults, relative to this directory):

    source/kv_cache/kv_cache.ipynb        the instructor's notebook (made by jupytext from kv_cache.pct.py)
    release/kv_cache/kv_cache.ipynb       the student version  (nbgrader generate_assignment kv_cache)
    submitted/<student>/kv_cache/         what students hand in (nbgrader collect / zip_collect, or copy)
    autograded/<student>/kv_cache/        graded notebooks     (nbgrader autograde kv_cache)
    feedback/<student>/kv_cache/          HTML feedback        (nbgrader generate_feedback kv_cache)
    gradebook.db                          scores, per graded cell (nbgrader export: grades.csv)

The hidden tests import the kit (``grader``, ``catalogue``, ``solutions``), so run nbgrader
with the kit's environment (``.venv/bin/nbgrader``): the notebook's ``python3`` kernel is then
that environment's Python.
"""
c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "kvkit"

# The hidden checks run the grader's trials on each submission; a slow laptop or a
# loaded CI runner needs more than nbgrader's 30 s per cell.
c.Execute.timeout = 300
c.Execute.startup_timeout = 120
