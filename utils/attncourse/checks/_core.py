"""Shared machinery of the visible checks: calling learner code, comparing, reporting."""
import contextlib
import functools
import json
import warnings
from importlib import resources

import torch


class CheckFailed(AssertionError):
    """A visible check found a mistake; the message says which and how to fix it."""


def fail(message):
    raise CheckFailed(message)


def ok(message):
    print(f"\u2713 {message}")


@functools.lru_cache(maxsize=None)
def load_cases(chapter):
    """Fixed inputs and expected values for a chapter, stored beside this module (see tools/make_check_data.py)."""
    text = resources.files("attncourse.checks").joinpath("data", f"{chapter}.json").read_text()
    return json.loads(text)


def tensor(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def require_callable(obj, name, kind="function"):
    if isinstance(obj, torch.Tensor) or not callable(obj):
        fail(f"pass your {kind} {name} itself (e.g. check({name})), not {type(obj).__name__}")


def call(fn, *args, what, **kwargs):
    """Call learner code; turn 'not implemented' and crashes into messages that say where.

    Warnings raised by learner code are reported on stdout: on stderr, nbgrader would score
    the whole test cell 0 for a harmless warning.
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(*args, **kwargs)
        for w in caught[:3]:
            print(f"note: {what} warned: {w.category.__name__}: {w.message}")
        return result
    except NotImplementedError:
        fail(f"{what} is not implemented yet: replace `raise NotImplementedError()` with your code")
    except CheckFailed:
        raise
    except Exception as exc:
        fail(f"{what} raised {type(exc).__name__}: {exc}")


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
    return float((a.detach().to(torch.float64) - b.to(torch.float64)).abs().max())


def load_weights(module, state, what):
    """Load stored weights into a learner's module, explaining a name or shape mismatch."""
    mine = {k: list(v.shape) for k, v in module.state_dict().items()}
    wanted = {k: list(torch.as_tensor(v).shape) for k, v in state.items()}
    if mine != wanted:
        missing = sorted(set(wanted) - set(mine))
        extra = sorted(set(mine) - set(wanted))
        wrong = sorted(k for k in set(mine) & set(wanted) if mine[k] != wanted[k])
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"{k} {wanted[k]}" for k in missing))
        if extra:
            parts.append("unexpected " + ", ".join(f"{k} {mine[k]}" for k in extra))
        if wrong:
            parts.append("wrong shape " + ", ".join(f"{k} is {mine[k]}, expected {wanted[k]}" for k in wrong))
        fail(f"{what}'s parameters must have exactly the stated names and shapes: " + "; ".join(parts))
    module.load_state_dict({k: tensor(v).to(module.state_dict()[k].dtype) for k, v in state.items()})


def build_module(cls, init, name, state):
    """Build a learner's module from ``init``, load the stored weights, in float64 and eval mode."""
    require_callable(cls, name, kind="class")
    module = call(cls, **init, what=f"{name}({', '.join(f'{k}={v}' for k, v in init.items())})")
    if not isinstance(module, torch.nn.Module):
        fail(f"{name}(...) should build a torch.nn.Module")
    module = module.double()
    load_weights(module, state, name)
    return module.eval()


@contextlib.contextmanager
def forbidding(paths, exercise):
    """Visible-check side of a from-scratch exercise: a call of a forbidden built-in fails the check
    with a message that names it (see attncourse.forbid)."""
    from ..forbid import ForbiddenCall, forbidding as _forbidding
    try:
        with _forbidding(paths, exercise):
            yield
    except ForbiddenCall as exc:
        fail(str(exc))
