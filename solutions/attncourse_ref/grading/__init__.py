"""The grading server: builds randomized cases, computes reference answers, judges a submission's.

It runs as ``python -I -m attncourse_ref.grading`` in a fresh interpreter, started by
``attncourse.autograde`` from a hidden test cell.  Nothing the submission did to its own
kernel (replacing ``torch.allclose``, seeding or patching ``torch.randn``, faking this
package in ``sys.modules``) reaches this process: the reference answers and the comparison
both happen here, and only numbers cross the pipe.
"""
import hashlib
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from attncourse import _wire

# Tolerances per dtype: (rtol, atol).  Cases are small (a few hundred terms per sum), so
# float32 rounding stays well inside 1e-4 relative; float64 must agree almost to the bit (1e-9:
# a float32 computation of float64 inputs, off by about 1e-7, fails).
TOLERANCE = {np.dtype("float32"): (1e-4, 1e-5), np.dtype("float64"): (1e-9, 1e-12)}


def tolerance(dtype):
    """(rtol, atol) the server compares a float dtype with (float16 and bfloat16 more loosely)."""
    return TOLERANCE.get(np.dtype(dtype), (1e-5, 1e-6))


REGISTRY = {}
FORBID = {}
ALLOW = {}


def hidden_test(name, forbid=(), allow=None):
    """Register a case builder ``fn(rng) -> list[Case]`` under a test id like 'ch02.causal_mask'.

    ``forbid``: dotted paths of the built-ins a from-scratch exercise may not call
    (e.g. "torch.nn.functional.layer_norm"); ``allow``: for an elementary computation, everything it may
    run (attncourse.forbid.ELEMENTARY and the exercise's additions); see attncourse.forbid.
    """
    def register(fn):
        REGISTRY[name] = fn
        FORBID[name] = tuple(forbid)
        ALLOW[name] = None if allow is None else sorted(allow)
        return fn
    return register


def seed_for(test_id):
    """Cases are pseudo-random but reproducible: a regrade gives the same verdict.

    Set ATTNCOURSE_GRADING_SALT to draw a fresh set of cases (say, once per term).
    """
    salt = os.environ.get("ATTNCOURSE_GRADING_SALT", "attncourse")
    return int.from_bytes(hashlib.sha256(f"{salt}:{test_id}".encode()).digest()[:8], "little")


@dataclass
class Case:
    """One call of the submission: what to call and with what, and the reference's answer."""
    call: dict                      # the JSON the client reads (see attncourse.autograde)
    arrays: dict                    # named inputs referred to by ``call``
    expected: list                  # reference outputs (and input gradients, if asked), as numpy
    describe: str                   # shown to the learner when this case fails
    tol: dict = field(default_factory=dict)   # per-dtype (rtol, atol) overrides
    labels: list = field(default_factory=list)  # what each output is, for the message (else its index)


def fixed(shape, seed):
    """Small, readable, reproducible inputs: normal draws rounded to two decimals."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).round() / 100


def _encode(value, arrays, key):
    return _wire.encode_value(value, arrays, key)


def _flatten(out):
    """The client normalises outputs the same way (attncourse._wire.flatten_result)."""
    return _wire.flatten_result(out)


def describe_value(v):
    if isinstance(v, torch.Tensor):
        return f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
    return repr(v)


def _cotangents(outputs, rng, grad_outputs):
    return [torch.from_numpy(rng.standard_normal(outputs[i].shape)).to(outputs[i].dtype) for i in grad_outputs]


def no_history_case(fn, args, held, describe=""):
    """A call ``fn(*args)`` whose arguments ``held`` (indices) require grad, where the text says the output has
    no autograd history: the client adds one boolean output (does any returned tensor require grad?), which
    must be False, so that a result computed with autograd on fails however right its numbers."""
    case = function_case(fn, args, describe=describe)
    case.call["requires_grad"] = list(held)
    case.expected.append(np.array(False))
    case.labels = ["your value"] if len(case.expected) == 2 else []
    return case


def function_case(fn, args, kwargs=None, *, rng=None, grad_args=(), grad_outputs=(0,), describe="", tol=None):
    """A call ``fn(*args, **kwargs)``; with ``grad_args``, also d<outputs, cotangents>/d args."""
    kwargs = kwargs or {}
    arrays = {}
    call = {"kind": "function",
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)],
            "kwargs": {k: _encode(v, arrays, f"kw_{k}") for k, v in kwargs.items()}}
    args = [a.detach().clone().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for i, a in enumerate(args)]
    out = fn(*args, **kwargs)
    expected = _flatten(out)
    if grad_args:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        cots = _cotangents(outs, rng, grad_outputs)
        for j, (i, c) in enumerate(zip(grad_outputs, cots)):
            arrays[f"cot{j}"] = c.numpy()
        call["grad"] = {"args": list(grad_args), "outputs": list(grad_outputs),
                        "cotangents": [f"cot{j}" for j in range(len(cots))]}
        total = sum((outs[i] * c).sum() for i, c in zip(grad_outputs, cots))
        grads = torch.autograd.grad(total, [args[i] for i in grad_args], allow_unused=True)
        expected += [np.zeros(args[i].shape, dtype=args[i].detach().numpy().dtype) if g is None else g.numpy()
                     for i, g in zip(grad_args, grads)]
    return Case(call, arrays, expected, describe or _describe_call(args, kwargs), tol or {})


def module_case(module, init, args, kwargs=None, *, describe="", tol=None, train_seed=None):
    """Build the submission's module with ``init``, load ``module``'s weights into it, call it.

    With ``train_seed``, both sides call it in training mode right after torch.manual_seed(train_seed):
    dropout is active and, drawn through the module's own nn.Dropout layers in the order of the
    computation, gives the same masks on both sides."""
    kwargs = kwargs or {}
    module.eval()
    if train_seed is not None:
        module.train()
    arrays = {}
    dtype = next(module.parameters()).dtype
    call = {"kind": "module", "init": init, "dtype": str(dtype).replace("torch.", ""),
            "state": {name: _encode(t, arrays, f"state.{name}")["a"] for name, t in module.state_dict().items()},
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)],
            "kwargs": {k: _encode(v, arrays, f"kw_{k}") for k, v in kwargs.items()}}
    if train_seed is not None:
        call["train_seed"] = int(train_seed)
        torch.manual_seed(int(train_seed))
    with torch.no_grad():
        expected = _flatten(module(*args, **kwargs))
    module.eval()
    # one template, no braces inside a placeholder: the client can then translate the description whole
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    text = describe or f"{type(module).__name__}({sizes}) on {_describe_call(args, kwargs)}"
    return Case(call, arrays, expected, text, tol or {})


def _describe_call(args, kwargs):
    parts = [describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _order(x):
    """1e-02 for 0.0371: a power of ten, not the value."""
    return f"{10.0 ** math.floor(math.log10(x)):.0e}" if math.isfinite(x) and x > 0 else f"{x:g}"


def compare(case, got):
    """None if ``got`` (list of arrays from the client) matches the reference, else the reason."""
    if getattr(case, "judge", None) is not None:      # judged_case: properties and statistics decide
        return case.judge(got)
    exp = case.expected
    if len(got) != len(exp):
        return f"expected {len(exp)} returned value(s) (plus gradients), got {len(got)}"
    if "requires_grad" in case.call and got[-1].shape == () and bool(got[-1]):      # no_history_case's flag
        return ("the returned tensor carries autograd history (requires_grad=True when its input requires grad): "
                "the text says it has none; compute it under torch.no_grad() or from .detach()")
    outputs = len(exp) - len(case.call.get("grad", {}).get("args", []))      # the call's own outputs, then gradients
    for i, (g, e) in enumerate(zip(got, exp)):
        # One output (a loss, a count) is "your value"; of several, the message says which.
        what = ("your value" if outputs == 1 else f"returned value {i}") if i < outputs else "the gradient"
        what = case.labels[i] if i < len(case.labels) else what
        if g.shape != e.shape:
            return f"{what} has shape {list(g.shape)}, expected {list(e.shape)}"
        if case.call.get("raises"):
            if not (g.shape == () and g.dtype == np.bool_ and bool(g)):
                return f"the call should raise {case.call['raises']}, but it returned normally or raised another exception"
            continue
        if e.dtype == np.bool_:
            if g.dtype != np.bool_:
                return f"{what} has dtype {g.dtype}, expected bool"
            if not np.array_equal(g, e):
                return f"{what}: {int((g != e).sum())} of {e.size} entries differ from the reference"
            continue
        if e.dtype.kind == "f":
            if g.dtype != e.dtype:
                return f"{what} has dtype {g.dtype}, expected {e.dtype} (keep the inputs' dtype)"
            rtol, atol = case.tol.get(e.dtype) or tolerance(e.dtype)
            same_nan = np.array_equal(np.isnan(g), np.isnan(e))
            ok = same_nan and np.allclose(np.nan_to_num(g), np.nan_to_num(e), rtol=rtol, atol=atol)
            if not ok:
                err = np.abs(np.nan_to_num(g) - np.nan_to_num(e))
                worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
                # The kernel learns which output is wrong, where, and the error's order of magnitude:
                # enough to debug, not a value to steer guesses by (and a test is answered once).
                nans = "" if same_nan else "; NaNs in different places"
                return (f"{what} differs from the reference: max abs error of order {_order(float(err.max()))} "
                        f"at index {tuple(int(x) for x in worst)} (tolerance rtol={rtol:g}, atol={atol:g}){nans}")
            continue
        if e.dtype.kind in "iu" and g.dtype != e.dtype:
            # Integer results (ids, counts, indices): a float tensor of the right values is not one.
            return f"{what} has dtype {g.dtype}, expected {e.dtype} (an integer result)"
        if g.shape != e.shape or not np.array_equal(g, e):
            return f"{what} differs from the reference"
    return None


def layer_case(fn, kind, weight, args, *, describe="", tol=None):
    """Call ``fn(layer, *args)`` where ``layer`` is the fixed layer ``kind`` (attncourse.layers)."""
    from attncourse.layers import make_layer
    arrays = {"weight": weight.numpy()}
    call = {"kind": "layer", "layer": kind, "weight": "weight",
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)], "kwargs": {}}
    expected = _flatten(fn(make_layer(kind, weight), *args))
    return Case(call, arrays, expected, describe or f"(layer={kind!r}, " + _describe_call(args, {})[1:], tol or {})


def raises_case(args, kwargs=None, *, exception="ValueError", describe=""):
    """A call ``fn(*args, **kwargs)`` that must raise ``exception`` (a built-in exception's name)."""
    kwargs = kwargs or {}
    arrays = {}
    call = {"kind": "function", "raises": exception,
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)],
            "kwargs": {k: _encode(v, arrays, f"kw_{k}") for k, v in kwargs.items()}}
    text = describe or _describe_call(args, kwargs)
    return Case(call, arrays, [np.asarray(True)], f"{text} must raise {exception}")



def module_grad_case(module, init, args, kwargs=None, *, rng, grad_args=(0,), grad_outputs=(0,), describe="", tol=None):
    """As module_case, with autograd on: also d<outputs, cotangents>/d args (e.g. a from-scratch LayerNorm)."""
    kwargs = kwargs or {}
    module.eval()
    case = module_case(module, init, args, kwargs, describe=describe, tol=tol)
    case.call["kind"] = "module_grad"
    args = [a.detach().clone().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for i, a in enumerate(args)]
    out = module(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    cots = _cotangents(outs, rng, grad_outputs)
    for j, c in enumerate(cots):
        case.arrays[f"cot{j}"] = c.numpy()
    case.call["grad"] = {"args": list(grad_args), "outputs": list(grad_outputs),
                         "cotangents": [f"cot{j}" for j in range(len(cots))]}
    grads = torch.autograd.grad(sum((outs[i] * c).sum() for i, c in zip(grad_outputs, cots)),
                                [args[i] for i in grad_args], allow_unused=True)
    case.expected += [np.zeros(args[i].shape, dtype=args[i].detach().numpy().dtype) if g is None else g.numpy()
                      for i, g in zip(grad_args, grads)]
    return case


def ranks_case(fn, per_rank_args, *, describe="", tol=None):
    """Call ``fn(*per_rank_args[r])`` on every rank r of a torch.distributed group of len(per_rank_args)
    ranks; the outputs of all ranks, in rank order.  For DDP code (e.g. an all-reduce) on both sides.
    The submission's ranks are gloo processes (attncourse.lab.ranks); the reference's are threads:
    its outputs do not depend on how ranks are run, and this server must not fork its threads."""
    from attncourse.lab.ranks import run_ranks
    arrays = {}
    call = {"kind": "ranks", "args": [], "kwargs": {},
            "ranks": [[_encode(a, arrays, f"r{r}.arg{i}") for i, a in enumerate(args)]
                      for r, args in enumerate(per_rank_args)]}
    expected = _flatten(run_ranks(fn, per_rank_args, processes=False))
    each = ", ".join(f"rank {r} " + _describe_call(args, {}) for r, args in enumerate(per_rank_args))
    text = describe or f"on {len(per_rank_args)} ranks: {each}"
    return Case(call, arrays, expected, text, tol or {})


def judged_case(args, kwargs=None, *, judge, describe="", repeat=1):
    """A call ``fn(*args, **kwargs)`` decided by ``judge(outputs) -> None or the reason`` (outputs: the
    flattened list of numpy arrays) instead of by the reference's outputs: for exercises whose random
    draws are free, graded by properties and statistics with stated tolerances (chapter 06's sampler
    and masking)."""
    kwargs = kwargs or {}
    arrays = {}
    call = {"kind": "function",
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)],
            "kwargs": {k: _encode(v, arrays, f"kw_{k}") for k, v in kwargs.items()}}
    case = Case(call, arrays, [], describe or _describe_call(args, kwargs))
    case.judge = judge if repeat == 1 else _same_every_time(judge, repeat)
    if repeat > 1:
        call["repeat"] = repeat
    return case


def _same_every_time(judge, repeat):
    """A judge for a case run ``repeat`` times with generators of the same seed (the global RNG
    reseeded differently before each run): every run must return the same, then ``judge`` decides."""
    def same(got):
        if len(got) % repeat:
            return f"expected the same number of values from each of the {repeat} calls"
        n = len(got) // repeat
        runs = [got[r * n:(r + 1) * n] for r in range(repeat)]
        if any(len(a) != len(b) or any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b))
               for a, b in zip(runs, runs[1:])):
            return (f"{repeat} calls with generators of the same seed gave different results: draw every random "
                    "number from the generator argument, not from torch's global random state")
        return judge(runs[0])
    return same


def optimizer_case(cls, groups, defaults, steps, *, describe="", tol=None):
    """An optimizer class run on fresh parameters for len(steps) steps (attncourse.autograde.run_optimizer:
    the learning rates and gradients of each step are given); compared after every step: each
    parameter's value, its state["exp_avg"], state["exp_avg_sq"] and state["step"]."""
    from attncourse.autograde import run_optimizer
    arrays = {}
    call = {"kind": "optimizer", "args": [_encode(v, arrays, f"arg{i}") for i, v in enumerate((groups, defaults, steps))],
            "kwargs": {}}
    expected = _flatten(run_optimizer(cls, groups, defaults, steps))
    n = sum(len(g["params"]) for g in groups)
    labels = []
    for s in range(1, len(steps) + 1):
        for j in range(n):
            labels += [f"after step {s}, parameter {j}", f'after step {s}, state["exp_avg"] of parameter {j}',
                       f'after step {s}, state["exp_avg_sq"] of parameter {j}',
                       f'after step {s}, state["step"] of parameter {j}']
    return Case(call, arrays, expected, describe or f"{cls.__name__}({defaults}) for {len(steps)} steps", tol or {},
                labels)


def loader_case(fn, module, args, kwargs=None, *, describe="", tol=None):
    """A call ``fn(target, *args, **kwargs)`` that fills ``target`` in place, where ``target`` is a bare
    module with exactly ``module``'s parameter names and shapes (zeros), built by the client (see
    attncourse.autograde.bare_module).  Compared: target's parameter table and values afterwards.
    ``fn`` is run here on ``module`` itself."""
    kwargs = kwargs or {}
    arrays = {}
    dtype = next(module.parameters()).dtype
    call = {"kind": "loader", "dtype": str(dtype).replace("torch.", ""),
            "shapes": {name: list(p.shape) for name, p in module.named_parameters()},
            "args": [_encode(a, arrays, f"arg{i}") for i, a in enumerate(args)],
            "kwargs": {k: _encode(v, arrays, f"kw_{k}") for k, v in kwargs.items()}}
    with torch.no_grad():
        fn(module, *args, **kwargs)
    expected = _flatten([(name, p) for name, p in sorted(module.named_parameters())])
    return Case(call, arrays, expected, describe or "(model, " + _describe_call(args, kwargs)[1:], tol or {})
