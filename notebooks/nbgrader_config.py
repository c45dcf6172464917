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

# ------------------------------------------------------------ an optional section not attempted
#
# `kvkit grade` leaves an optional section that was not attempted out of its total (a rubric criterion of
# tier "none" whose answer cells still hold nbgrader's stubs: the PyTorch port) and scales the other points
# up, so it counts neither for nor against. nbgrader's total is fixed, so here the section's graded cell is
# worth the student's own share instead: its points times the fraction earned on the other graded cells,
# which leaves the notebook's score, as a fraction of its total, what the other cells make it
# (docs/notebook.md, "One grade, two graders"). An attempted section is graded as usual, right or wrong.

import os  # noqa: E402 - the configuration above is what an instructor reads first
import tempfile  # noqa: E402

import nbformat  # noqa: E402
from nbconvert.preprocessors import Preprocessor  # noqa: E402
from nbgrader import utils as nbgrader_utils  # noqa: E402
from nbgrader.converters.autograde import Autograde  # noqa: E402
from nbgrader.preprocessors import SaveAutoGrades  # noqa: E402
from traitlets import Bool  # noqa: E402

# The optional sections: rubric criterion -> the hand-back role of the answer cells it grades (kvkit's
# `role` marker; grader/stages/layout.py lays each role out as one file, left out when not attempted).
OPTIONAL_SECTIONS = {"torch_port": "port"}


def _criteria(cell) -> set:
    return set(cell.metadata.get("kvkit", {}).get("criteria", []))


class OptionalSectionShare(Preprocessor):
    """Give the graded cell of an optional section not attempted the student's share of its points.

    Runs after the notebook is executed, before nbgrader saves the scores. The cell's score is nbgrader's
    partial credit (an `execute_result` holding a number, placed before the cell's own outputs), with a line
    that says why; a share of 0 leaves the cell as it ran (0 either way).
    """

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        left_out = self.not_attempted(nb)
        graded = [c for c in nb.cells if c.cell_type == "code" and nbgrader_utils.is_grade(c)]
        counted = [c for c in graded if not _criteria(c) & left_out]
        total = sum(float(c.metadata.nbgrader.points) for c in counted)
        earned = sum(nbgrader_utils.determine_grade(c)[0] or 0.0 for c in counted)
        for cell in graded:
            if not (_criteria(cell) & left_out) or not total:
                continue
            share = round(float(cell.metadata.nbgrader.points) * earned / total, 2)
            if share:
                cell.outputs[:0] = [
                    nbformat.v4.new_output("stream", name="stdout", text=(
                        f"Not attempted: this section ({', '.join(sorted(_criteria(cell)))}) is optional, so it "
                        f"counts neither for nor against you. Its cell is worth your share of its points: the "
                        f"fraction you earned on the other graded cells ({earned:g} of {total:g} points).\n")),
                    nbformat.v4.new_output("execute_result", data={"text/plain": f"{share:g}"},
                                           execution_count=cell.get("execution_count")),
                ]
        return nb, resources

    def not_attempted(self, nb) -> set:
        """The optional criteria (tier "none" in the kit's rubric) whose answer cells `kvkit grade` would leave
        out as not attempted: it lays the notebook out as a hand-back, and no file of that role comes out."""
        from grader.stages import layout, rubric

        criteria = rubric.load().criteria
        sections = {cid: role for cid, role in OPTIONAL_SECTIONS.items()
                    if cid in criteria and criteria[cid]["tier"] == "none"}
        if not sections:
            return set()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hand-back.ipynb")
            nbformat.write(nb, path)
            try:
                files = layout.notebook_files(path)
            except layout.SubmissionError:
                return set()  # kvkit grade grades nothing of it either: nbgrader's own scores stand
        return {cid for cid, role in sections.items() if layout.ROLE_FILES[role] not in files}


_steps = list(Autograde.class_traits()["autograde_preprocessors"].default())  # nbgrader's own list
c.Autograde.autograde_preprocessors = (_steps[:_steps.index(SaveAutoGrades)] + [OptionalSectionShare]
                                       + _steps[_steps.index(SaveAutoGrades):])
