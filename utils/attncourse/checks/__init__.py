"""Visible checks: small fixed cases with stored expected values, plus property checks that
name the mistake they find.  ``from attncourse.checks import ch02`` then ``ch02.check_attention(fn)``.

Passing a visible check is necessary, not sufficient: the hidden tests try many more shapes,
dtypes, masks and seeds.
"""
from ._core import CheckFailed, NotDoneYet

__all__ = ["CheckFailed", "NotDoneYet"]
