"""The hidden reference package: one canonical implementation of every graded component.

Submissions must never use it.  When nbgrader grades a notebook it sets
ATTNCOURSE_GRADING_KERNEL=1 (see nbgrader_config.py), and importing this package from such a
kernel fails.  The grading server (``python -m attncourse_ref.grading``) runs in a fresh
interpreter without that variable, so it alone computes reference answers.
"""
import os

if os.environ.get("ATTNCOURSE_GRADING_KERNEL") == "1":
    raise ImportError(
        "The course's reference solutions are not available to a submission being graded. "
        "Remove the import of 'attncourse_ref' and write the code yourself."
    )
