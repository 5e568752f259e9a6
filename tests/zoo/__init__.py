"""The mistake zoo: known-wrong implementations of every graded component.

Each ``Variant`` names the solution cell it replaces (``cell``), the test cells whose hidden
tests it must fail (``fails``; every other test cell of the chapter must still pass), the
visible check that should catch it and a phrase the check's message must contain.
``impl`` is a function (or a method taking ``self``) with the same signature as the
reference; its body is what the fake class's partial submissions paste into the cell.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    name: str
    cell: str            # solution cell grade_id
    impl: object
    fails: frozenset     # test cell grade_ids whose hidden tests must fail
    check: str           # visible check function in attncourse.checks.<chapter>
    says: str            # phrase the visible check's message must contain
    hidden: tuple = ()   # hidden test ids (server side) this variant must fail; derived if empty
    check_only: frozenset = frozenset()   # test cells it loses through their visible check alone (hidden test passes)

    @property
    def loses(self):
        """The test cells nbgrader scores 0: those whose hidden test fails, and those whose visible check does."""
        return self.fails | self.check_only


def variant(name, cell, fails, check, says, check_only=()):
    def register(impl):
        return Variant(name, cell, impl, frozenset(fails), check, says, check_only=frozenset(check_only))
    return register


def collector():
    """(variants, add) for a chapter's zoo module: ``@add(name, cell, fails, check, says)`` registers."""
    variants = []

    def add(name, cell, fails, check, says, check_only=()):
        def register(impl):
            variants.append(variant(name, cell, fails, check, says, check_only)(impl))
            return impl
        return register
    return variants, add
