"""Visible checks: small fixed cases with stored expected values, plus property checks that
name the mistake they find.  ``from attncourse.checks import ch02`` then ``ch02.check_attention(fn)``.

Passing a visible check is necessary, not sufficient: the hidden tests try many more shapes,
dtypes, masks and seeds.
"""
from .. import GRADING
from ._core import CheckFailed

if GRADING:
    # Start the grading server now, while the notebook runs, rather than at the first hidden test.
    from .. import autograde as _autograde
    _autograde.start_server()

__all__ = ["CheckFailed"]
