"""Shared machinery of the visible checks: calling learner code, comparing, reporting."""
import contextlib
import functools
import json
import warnings
from importlib import resources

import torch
from torch.overrides import TorchFunctionMode

from ..i18n import translate


class CheckFailed(AssertionError):
    """A visible check found a mistake; the message says which and how to fix it."""


class NotDoneYet(CheckFailed):
    """The exercise still raises NotImplementedError (`attncourse validate` lists it as not done)."""


def fail(message, kind=CheckFailed):
    raise kind(translate(message))   # written in English, shown in the learner's language (attncourse.i18n)


def ok(message):
    print(f"\u2713 {translate(message)}")


@functools.lru_cache(maxsize=None)
def load_cases(chapter):
    """Fixed inputs and expected values for a chapter, stored beside this module (see tools/make_check_data.py)."""
    text = resources.files("attncourse.checks").joinpath("data", f"{chapter}.json").read_text()
    return json.loads(text)


def tensor(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def require_callable(obj, name, kind="function"):
    if isinstance(obj, torch.Tensor) or not callable(obj):
        # one message per kind, so that each translates whole (a word formatted in would stay English)
        if kind == "class":
            fail(f"pass your class {name} itself (e.g. check({name})), not {type(obj).__name__}")
        fail(f"pass your function {name} itself (e.g. check({name})), not {type(obj).__name__}")


def call(fn, *args, what, **kwargs):
    """Call learner code; turn 'not implemented' and crashes into messages that say where.

    Warnings raised by learner code are reported on stdout: on stderr, nbgrader would score
    the whole test cell 0 for a harmless warning.
    """
    inputs = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k}", a) for k, a in kwargs.items()]
    copies = [(name, a, a.detach().clone()) for name, a in inputs if isinstance(a, torch.Tensor)]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(*args, **kwargs)
        for w in caught[:3]:
            print(translate(f"note: {what} warned: {w.category.__name__}: {w.message}"))
        for name, a, copy in copies:
            if not _unchanged(a, copy):
                fail(f"{what} changed its {name} in place (x -= ..., x.div_(...), x[...] = ...): the caller's "
                     "tensor is not yours to change, and autograd cannot backpropagate through it. "
                     "Compute on a new tensor instead")
        return result
    except NotImplementedError:
        fail(f"{what} is not implemented yet: replace `raise NotImplementedError()` with your code", NotDoneYet)
    except CheckFailed:
        raise
    except Exception as exc:
        fail(f"{what} raised {type(exc).__name__}: {exc}")


def _unchanged(a, copy):
    if tuple(a.shape) != tuple(copy.shape) or a.dtype != copy.dtype:
        return False
    a = a.detach()
    equal = a == copy
    if a.is_floating_point() or a.is_complex():
        equal |= a.isnan() & copy.isnan()
    return bool(equal.all())


def expect_tensor(x, what, shape=None, dtype=None):
    if not isinstance(x, torch.Tensor):
        fail(f"{what} should be a torch.Tensor, got {type(x).__name__}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        fail(f"{what} has shape {list(x.shape)}, expected {list(shape)}")
    if dtype is not None and x.dtype != dtype:
        fail(f"{what} has dtype {x.dtype}, expected {dtype}")
    return x


def expect_pair(out, what):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} should return a pair (output, weights), got {type(out).__name__}")
    return out


def close(a, b, atol=1e-6):
    """Same shape and max |a - b| <= atol.  Plain arithmetic rather than torch.allclose: a notebook
    that replaced torch.allclose must not be able to change which mistake a check names."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return tuple(a.shape) == tuple(b.shape) and max_error(a, b) <= atol


def same(a, b):
    """Exact equality of two (integer or bool) tensors, without torch.equal (see close)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return tuple(a.shape) == tuple(b.shape) and bool((a == b).all())


def max_error(a, b):
    if a.numel() == 0:
        return 0.0
    return float((a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs().max())


def load_weights(module, state, what):
    """Load stored weights into a learner's module, explaining a name or shape mismatch."""
    mine = {k: list(v.shape) for k, v in module.state_dict().items()}
    wanted = {k: list(torch.as_tensor(v).shape) for k, v in state.items()}
    if mine != wanted:
        missing = sorted(set(wanted) - set(mine))
        extra = sorted(set(mine) - set(wanted))
        wrong = sorted(k for k in set(mine) & set(wanted) if mine[k] != wanted[k])
        parts = [translate(f"missing parameter {k} {wanted[k]}") for k in missing]
        parts += [translate(f"unexpected parameter {k} {mine[k]}") for k in extra]
        parts += [translate(f"parameter {k} has shape {mine[k]}, expected {wanted[k]}") for k in wrong]
        details = "; ".join(parts)
        fail(f"{what}'s parameters must have exactly the stated names and shapes: {details}")
    module.load_state_dict({k: tensor(v).to(module.state_dict()[k].dtype) for k, v in state.items()})


def build_module(cls, init, name, state):
    """Build a learner's module from ``init``, load the stored weights, in float64 and eval mode."""
    require_callable(cls, name, kind="class")
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    module = call(cls, **init, what=f"{name}({sizes})")
    if not isinstance(module, torch.nn.Module):
        fail(f"{name}(...) should build a torch.nn.Module")
    module = module.double()
    load_weights(module, state, name)
    return module.eval()


@contextlib.contextmanager
def forbidding(paths, exercise, allow=None):
    """Visible-check side of a from-scratch exercise: a call of a forbidden built-in (or, with ``allow``, of
    anything not allowed) fails the check with a message that names it (see attncourse.forbid)."""
    from ..forbid import ForbiddenCall, forbidding as _forbidding
    try:
        with _forbidding(paths, exercise, allow):
            yield
    except ForbiddenCall as exc:
        fail(str(exc))


def _float_tensors(out):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _agrees(low, high):
    """A float32 result equals its float64 counterpart to float32 rounding (where finite)."""
    finite = high.isfinite()
    if not finite.any():
        return True
    return max_error(low[finite], high[finite]) <= 1e-4 * (1 + float(high[finite].abs().max()))


def dtypes_and_gradients(fn, args, what, grad_args=(), **kwargs):
    """What the hidden tests also do with an exercise: call it in float32 and in float64, and
    backpropagate through it.

    Every float output must keep the inputs' dtype and agree between the two dtypes (to float32
    precision).  With ``grad_args`` (positions of float64 inputs), the outputs must stay connected
    to those inputs (no NumPy round trip, no .detach() or .item()), backward must give finite
    gradients (``call`` checks that no input was changed in place).
    """
    results = {}
    for dtype in (torch.float32, torch.float64):
        cast = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        outs = _float_tensors(call(fn, *cast, what=f"{what} in {dtype}", **kwargs))
        for o in outs:
            if o.dtype != dtype:
                fail(f"{what}: with {dtype} inputs you returned {o.dtype}; keep the inputs' dtype "
                     "(a torch.tensor(...) or torch.zeros(...) you create needs dtype=x.dtype)")
        results[dtype] = outs
    for lo, hi in zip(results[torch.float32], results[torch.float64]):
        if tuple(lo.shape) != tuple(hi.shape):
            fail(f"{what}: float32 inputs give shape {list(lo.shape)}, float64 inputs {list(hi.shape)}")
        if not _agrees(lo, hi):
            fail(f"{what}: float32 and float64 inputs give different answers beyond float32 rounding; "
                 "is a constant stuck in one dtype?")
    if not grad_args:
        return
    inputs = [a.detach().to(torch.float64).clone().requires_grad_(i in grad_args)
              if isinstance(a, torch.Tensor) and a.is_floating_point() else a for i, a in enumerate(args)]
    try:
        outs = _float_tensors(call(fn, *inputs, what=f"{what} with requires_grad inputs", **kwargs))
    except CheckFailed as exc:
        if "in-place operation" in str(exc):
            fail(f"{what}: your function changes an input in place (x -= ..., x.mul_(...), x[...] = ...), which "
                 "breaks backpropagation and the caller's tensor; compute on a new tensor instead")
        raise
    if not any(o.requires_grad for o in outs):
        fail(f"{what}: the output is not connected to the inputs, so no gradient can flow back through it. "
             "The hidden tests backpropagate through this exercise: stay in torch operations "
             "(no NumPy round trip, no .detach(), .item() or .tolist())")
    g = torch.Generator().manual_seed(0)
    total = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).where(o.isfinite(), 0).sum()
                for o in outs if o.requires_grad)
    try:
        grads = torch.autograd.grad(total, [inputs[i] for i in grad_args], allow_unused=True)
    except RuntimeError as exc:
        fail(f"{what}: backpropagating through your code failed ({exc}); an in-place operation "
             "(x -= ..., x[...] = ...) on a tensor autograd still needs is the usual cause")
    for i, grad in zip(grad_args, grads):
        if grad is None:
            fail(f"{what}: the output does not depend on argument {i}, so it gets no gradient")
        if not grad.isfinite().all():
            fail(f"{what}: the gradient with respect to argument {i} contains NaN or inf")


def module_dtypes(module, args, what, **kwargs):
    """A module the hidden tests also build in float32: a float32 copy of ``module`` (already
    loaded, float64) given float32 inputs must return float32 outputs equal to the float64 ones
    to float32 precision.  A tensor created inside forward without dtype= (or .double()) fails."""
    import copy
    with torch.no_grad():
        expected = _float_tensors(call(module, *args, what=f"{what} in float64", **kwargs))
        cast = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        low = copy.deepcopy(module).float()
        got = _float_tensors(call(low, *cast, what=f"{what} in float32", **kwargs))
    for g, e in zip(got, expected):
        if g.dtype != torch.float32:
            fail(f"{what}: a float32 module with float32 inputs returned {g.dtype}; create tensors with the "
                 "inputs' dtype (dtype=x.dtype) and do not call .double() inside forward")
        if tuple(g.shape) != tuple(e.shape) or not _agrees(g, e):
            fail(f"{what}: the float32 module disagrees with the float64 one beyond float32 rounding")


class LargestTensor(TorchFunctionMode):
    """``with LargestTensor() as seen:`` records in ``seen.largest`` the most elements of any tensor a torch function
    or tensor method returned, and in ``seen.created`` the elements of all of them together (views included): what a
    check needs to tell a state or a latent from a T x T table or a full key, even one built in pieces.  (The
    profiler's memory timeline costs seconds on a loop of small steps; a TorchDispatchMode imports torch._dynamo on
    first use, 3.6 s.)"""
    largest = 0
    created = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
                self.created += o.numel()
        return out
