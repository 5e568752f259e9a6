"""Learner-side helpers for "Attention and Transformers, from RNNs to Mixture-of-Experts".

- ``attncourse.checks``: visible checks that name the mistake they find.
- ``attncourse.plots``: the figures the chapters draw.
- ``attncourse.autograde``: the client side of the hidden tests (used by nbgrader).
"""
__version__ = "0.1.0"
