"""Hidden tests under any term's salt.

An instructor sets ATTNCOURSE_GRADING_SALT (or lets tools/grade_class.py draw a secret one) to grade each
term on fresh cases.  Every hidden test's case builder must then work for *every* salt: build its cases
(constrained cases are built by construction, not by drawing until one fits), the same number of them,
with finite answers; and every known mistake of the zoo must still fail its hidden test under other salts
than the suite's own.
"""
import contextlib
import functools
import importlib
import os

import numpy as np
import pytest

from conftest import CHAPTERS
from fakeclass import zoo

pytestmark = pytest.mark.slow

SALTS = [f"term-{year}{half}" for year in range(2025, 2050) for half in "ab"]   # 50 terms
CHUNKS = 5


@contextlib.contextmanager
def salt(value):
    old = os.environ.get("ATTNCOURSE_GRADING_SALT")
    os.environ["ATTNCOURSE_GRADING_SALT"] = value
    try:
        yield
    finally:
        os.environ["ATTNCOURSE_GRADING_SALT"] = old


def _registry():
    from attncourse_ref.grading import REGISTRY
    for chapter in CHAPTERS:
        importlib.import_module(f"attncourse_ref.grading.{chapter}")
    return REGISTRY


def _build(test_id):
    """The cases, built as the grading server builds them (one thread, as it runs: two workers' threads on
    two cores, spinning in OpenMP, made this test ten times slower), with no case cache."""
    import torch
    from attncourse_ref.grading import __main__ as server
    cached, server.CASE_CACHE = server.CASE_CACHE, None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return server.build_cases(test_id)
    finally:
        server.CASE_CACHE = cached
        torch.set_num_threads(threads)


def _shape(cases):
    """How many cases, and which have a NaN among their answers (as the reference may rightly give: the
    mean cross-entropy over no token is NaN, as in PyTorch)."""
    return len(cases), {i for i, case in enumerate(cases) for value in case.expected
                        if np.asarray(value).dtype.kind in "fc" and np.isnan(np.asarray(value)).any()}


def salt_problems(test_ids, salts, baseline):
    """What goes wrong when ``test_ids``' cases are built under each of ``salts``: a builder that raises,
    builds no case or fewer than half as many as under the suite's salt (``baseline[test_id]``, a
    ``_shape``: some builders draw how many), or gives a NaN answer in a case that has none there."""
    problems = []
    for value in salts:
        with salt(value):
            for test_id in test_ids:
                try:
                    count, nans = _shape(_build(test_id))
                except Exception as err:                     # noqa: BLE001 - report every builder that fails
                    problems.append(f"{test_id} under salt {value!r}: {type(err).__name__}: {err}")
                    continue
                usual, usual_nans = baseline[test_id]
                if count == 0 or 2 * count < usual:
                    problems.append(f"{test_id} under salt {value!r}: {count} cases, against {usual} usually")
                problems += [f"{test_id} under salt {value!r}: case {i}'s answer has NaN" for i in sorted(nans - usual_nans)]
    return problems


@functools.lru_cache(maxsize=1)
def _baseline():
    """Each builder's _shape under the suite's salt: built once per test process, whichever chunks it runs."""
    return {test_id: _shape(_build(test_id)) for test_id in _registry()}


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_case_builder_works_under_many_salts(chunk):
    """Every builder under 10 of the 50 salts (five chunks, so that workers share them): none raises, each
    builds about as many cases as under the suite's salt, and no answer is NaN where it is not meant to be."""
    registry = _registry()
    problems = salt_problems(list(registry), SALTS[chunk::CHUNKS], _baseline())
    assert not problems, "\n".join(problems)


def test_the_salt_check_can_fail():
    """A builder that draws until a rare event happens (here, at most three draws of a 1-in-5 event) fails
    under some of the 50 salts, and the check names it and the salt; so does one whose answer is NaN."""
    from attncourse_ref.grading import REGISTRY, Case

    def fragile(rng):
        for _ in range(3):
            if rng.random() < 0.2:
                return [Case(call={}, arrays={}, expected=[np.array([1.0])], describe="")]
        raise AssertionError("could not build")

    def undefined(rng):
        return [Case(call={}, arrays={}, expected=[np.array([rng.random(), np.nan])], describe="")]

    REGISTRY["ch00.fragile"], REGISTRY["ch00.undefined"] = fragile, undefined
    try:
        problems = salt_problems(["ch00.fragile", "ch00.undefined"], SALTS, {"ch00.fragile": (1, set()),
                                                                              "ch00.undefined": (1, set())})
    finally:
        del REGISTRY["ch00.fragile"], REGISTRY["ch00.undefined"]
    assert any(p.startswith("ch00.fragile under salt 'term-") and "could not build" in p for p in problems)
    assert sum(p.startswith("ch00.undefined under salt") and p.endswith("case 0's answer has NaN") for p in problems) == len(SALTS)


OTHER_SALTS = ["term-2025a", "term-2031b"]      # with the suite's own ("attncourse"): three salts


@contextlib.contextmanager
def _server_with_salt(value):
    """The hidden tests' client talks to a private grading server; this one draws its cases with ``value``."""
    from attncourse import autograde
    previous = autograde._server
    autograde._server = None
    with salt(value):
        server = autograde.start_server()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            server.keep.kill()
        autograde._server = previous


# Mistakes of the exercises added last whose hidden tests were built so that most of their cases catch them
# (issues 33 and 34): each must fail more than half of its test's cases under every salt tried.
MOST_CASES = {
    "ch03": {"delta rule that adds k v^T (linear attention's write)", "delta rule that reads before it writes",
             "delta rule without the scale", "gated delta rule that ignores the gate",
             "gated delta rule multiplying by g, not exp(g)", "gated delta rule decaying after the write"},
    "ch05": {"label smoothing with log(softmax(x)) (underflows on large logits)",
             "beam search breaking ties by token id before hypothesis",
             "beam search where the later of two equal finished hypotheses wins",
             "beam search stopping early against lp(t), not lp(max_len)",
             "beam search where a finished hypothesis keeps its slot",
             "beam search refilled from the top 2 beam_size (fairseq, Hugging Face)"},
    "ch06": {"attention dropout applied in evaluation mode too", "random replacements drawn from 1 .. V - 1 (id 0 never)"},
    "ch08": {"loads counted by bincount without minlength (an idle last expert)",
             "mean load by integer division (T * k // E)", "bias update that keeps autograd history",
             "DeepSeekMoE routes under torch.no_grad() (its router can never learn)"},
    "ch09": {"AdamW decaying parameters that have no gradient"},
}

# Variants that can fail only a few cases of their test by construction, with how many they must fail under every
# salt: a float32 output buffer shows only without a shared expert and in float64, while leaving out or gating the
# shared expert shows only with one (the hidden test gives the second kind most cases).
AT_LEAST = {"ch08": {"DeepSeekMoE output buffer made in float32 (torch.zeros(shape))": 3}}


@pytest.mark.parametrize("value", ["attncourse", *OTHER_SALTS])
def test_every_zoo_variant_fails_its_hidden_test_under_other_salts(value):
    """test_zoo checks each variant under the suite's salt; here, under two more: a mistake caught by one
    or two lucky cases of one salt is not caught.  The variants of MOST_CASES must fail most cases, and those of
    AT_LEAST their number of cases, under the suite's salt too.  One grading server per salt, for every chapter
    (a server per chapter and salt started 30, 1.5 s each)."""
    from attncourse.autograde import run_hidden_test
    from test_zoo import candidate_for
    missed = []
    with _server_with_salt(value):
        for chapter in CHAPTERS:
            most, least = MOST_CASES.get(chapter, set()), AT_LEAST.get(chapter, {})
            named = most | set(least)
            assert named <= {v.name for v in zoo(chapter)}, named - {v.name for v in zoo(chapter)}
            for variant in zoo(chapter):
                if value == "attncourse" and variant.name not in named:
                    continue                                   # test_zoo runs every variant under this salt
                for test_cell in sorted(variant.fails):
                    verdict = run_hidden_test(f"{chapter}.{test_cell.removeprefix('test_')}", candidate_for(chapter, variant))
                    failed, n = len(verdict["failures"]), verdict["n_cases"]
                    if not failed:
                        missed.append(f"{chapter}: {variant.name} passes {test_cell} under salt {value!r}")
                    elif variant.name in most and 2 * failed <= n or failed < least.get(variant.name, 0):
                        missed.append(f"{chapter}: {variant.name} fails only {failed} of {n} cases of {test_cell} "
                                      f"under salt {value!r}")
    assert not missed, "\n".join(missed)
