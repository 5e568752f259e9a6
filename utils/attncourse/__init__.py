"""Learner-side helpers for "Attention and Transformers, from RNNs to Mixture-of-Experts".

- ``attncourse.checks``: visible checks that name the mistake they find.
- ``attncourse.plots``: the figures the chapters draw.
- ``attncourse.autograde``: the client side of the hidden tests (used by nbgrader).
"""
import os

from .i18n import language, set_language  # noqa: F401  (attncourse.set_language("zh"))

__version__ = "0.1.0"

# True inside a kernel that nbgrader started to grade a submission (see nbgrader_config.py).
# Cells that only *show* something (training runs, benchmarks, big figures) carry no points;
# they shrink their work when GRADING is true so grading a class stays fast.  Graded cells
# never depend on what those cells compute.
GRADING = os.environ.get("ATTNCOURSE_GRADING_KERNEL") == "1"
