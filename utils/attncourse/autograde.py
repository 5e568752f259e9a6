"""Client side of the hidden tests.  A hidden test cell calls ``grade("ch02.causal_mask", causal_mask)``.

The reference answers and the comparison live in the grading server, a separate Python process
that this kernel cannot read or write: the kernel only runs the submission on the inputs it is
sent and sends back what came out.

- Under the class grader (``tools/grade_class.py``) the server was started by the grader, outside
  the confined kernel, and this kernel reaches it over its own channel
  (``ATTNCOURSE_GRADING_SOCKET`` and ``ATTNCOURSE_GRADING_TOKEN``).  The server records every
  verdict itself; the grader scores from that record.  What this module prints in the test cell is
  feedback for the learner, not the grade: replacing this module changes the feedback, never the score.
- Elsewhere (the maintainers' tests) it starts a private server over a pipe.
"""
import atexit
import contextlib
import gc
import importlib.util
import io
import os
import socket
import subprocess
import sys
import warnings

import numpy as np
import torch

from . import _wire
from .i18n import translate

_REF_PACKAGE = "attncourse_ref"
_server = None


class _Channel:
    """The two byte streams to the grading server."""

    def __init__(self, rfile, wfile, keep=None):
        self.rfile, self.wfile, self.keep = rfile, wfile, keep

    def alive(self):
        return self.keep is None or getattr(self.keep, "poll", lambda: None)() is None


def start_server():
    """Connect to the grader's server if this is a grading kernel, else start a private one."""
    global _server
    if _server is not None and _server.alive():
        return _server
    path = os.environ.get("ATTNCOURSE_GRADING_SOCKET")
    if path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        _server = _Channel(sock.makefile("rb"), sock.makefile("wb"), sock)
        _wire.send(_server.wfile, {"token": os.environ.get("ATTNCOURSE_GRADING_TOKEN", "")})
        hello, _ = _wire.recv(_server.rfile)
        if "error" in hello:
            raise RuntimeError(hello["error"])
        return _server
    env = {k: v for k, v in os.environ.items() if k != "ATTNCOURSE_GRADING_KERNEL"}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen([sys.executable, "-I", "-m", "attncourse_ref.grading"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    atexit.register(proc.kill)
    _server = _Channel(proc.stdout, proc.stdin, proc)
    return _server


def _reference_dir():
    spec = importlib.util.find_spec(_REF_PACKAGE)      # finds it without importing it
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def _decode(ref, arrays, prefix):
    return _wire.decode_value(ref, arrays, prefix)


class InputChanged(Exception):
    """The submission changed one of its tensor arguments in place (the exercises leave their inputs alone)."""


class TooMuchMade(Exception):
    """A case bounded in the numbers it may make (``max_created``) made more: the stated shortcut was not taken."""


def _run_case(i, call, arrays, candidate):
    """The case's outputs; a case with ``repeat`` n runs n times, each with freshly decoded arguments
    (fresh generators with the same seed) after a different global seed, and returns all the outputs:
    a submission that draws with the generator it is given returns the same n times.  A case with
    ``max_created`` fails if the tensors the call returns from torch functions hold more numbers than that
    in all (a quantity built in pieces counts whole, which a peak-memory bound does not see)."""
    if call.get("max_created"):
        from .checks._core import LargestTensor
        with LargestTensor() as seen:
            out = _run_case_repeated(i, call, arrays, candidate)
        limit, made = call["max_created"], seen.created
        if made > limit:
            raise TooMuchMade(f"the call made {made:,} numbers in all, more than the {limit:,} this case allows: "
                              "it computes what the exercise says to avoid, even if in pieces")
        return out
    return _run_case_repeated(i, call, arrays, candidate)


def _run_case_repeated(i, call, arrays, candidate):
    if call.get("repeat"):
        out = []
        for r in range(call["repeat"]):
            torch.manual_seed(1000 + 7919 * r)           # the global RNG differs between the runs
            out += _run_case_once(i, call, arrays, candidate)
        return out
    return _run_case_once(i, call, arrays, candidate)


def _check_unchanged(call, arrays, p, args, kwargs):
    """Raise InputChanged if a tensor argument no longer holds what was sent."""
    named = [(f"argument {j}", ref, a) for j, (ref, a) in enumerate(zip(call["args"], args))]
    named += [(f"argument {k}", call["kwargs"][k], v) for k, v in kwargs.items()]
    while named:
        name, ref, value = named.pop()
        if "l" in ref and isinstance(value, (list, tuple)) and len(value) == len(ref["l"]):
            named += [(name, r, v) for r, v in zip(ref["l"], value)]       # a list of tensors (gradients, a cache)
        if "a" in ref and isinstance(value, torch.Tensor):
            sent = arrays[f"{p}/{ref['a']}"]
            now = value.detach().cpu().numpy()
            if now.shape != sent.shape or not np.array_equal(now, sent, equal_nan=sent.dtype.kind == "f"):
                raise changed_in_place(name)


def changed_in_place(name):
    return InputChanged(f"{name} was changed in place; the function must leave its inputs unchanged "
                        "(build new tensors, or work on a copy)")


def leaving_inputs_unchanged(fn):
    """``fn`` that raises InputChanged after changing one of its tensor arguments in place: the check of
    _check_unchanged for calls made where the sent arrays are not at hand (each rank of a ranks case)."""
    def checked(*args):
        before = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args]
        out = fn(*args)
        for j, (a, b) in enumerate(zip(args, before)):
            if b is not None and not torch.equal(a, b):
                raise changed_in_place(f"argument {j}")
        return out
    return checked


def _run_case_once(i, call, arrays, candidate):
    from .layers import make_layer
    p = f"c{i}"
    args = [_decode(a, arrays, p) for a in call["args"]]
    kwargs = {k: _decode(v, arrays, p) for k, v in call["kwargs"].items()}
    grad = call.get("grad")
    if grad:
        for j in grad["args"]:
            args[j] = args[j].requires_grad_(True)
    for j in call.get("requires_grad", ()):           # an input that requires grad, whose output must not
        args[j] = args[j].requires_grad_(True)
    if call["kind"] == "function":
        out = _raised(candidate, args, kwargs, call["raises"]) if call.get("raises") else candidate(*args, **kwargs)
        if not call.get("raises"):
            _check_unchanged(call, arrays, p, args, kwargs)
    elif call["kind"] == "module":
        module = candidate(**call["init"]).to(getattr(torch, call["dtype"]))
        state = {name: torch.from_numpy(arrays[f"{p}/{key}"].copy()) for name, key in call["state"].items()}
        _load_state(module, state)
        module.eval()
        if "train_seed" in call:
            # Training mode (dropout active): the same global seed as the reference's call, so that
            # the module's nn.Dropout layers, used in the order of the computation, draw the same masks.
            module.train()
            torch.manual_seed(call["train_seed"])
        with torch.no_grad():
            out = module(*args, **kwargs)
    elif call["kind"] == "layer":
        layer = make_layer(call["layer"], torch.from_numpy(arrays[f"{p}/{call['weight']}"].copy()))
        out = candidate(layer, *args, **kwargs)
        _check_unchanged(call, arrays, p, args, kwargs)
    elif call["kind"] == "module_grad":
        # As "module", with autograd on, so the case's "grad" can ask for input gradients.
        module = candidate(**call["init"]).to(getattr(torch, call["dtype"]))
        _load_state(module, {name: torch.from_numpy(arrays[f"{p}/{key}"].copy()) for name, key in call["state"].items()})
        module.eval()
        out = module(*args, **kwargs)
    elif call["kind"] == "ranks":
        # DDP code on several ranks: a gloo process each (threads where processes cannot talk).
        from .lab.ranks import run_ranks
        out = run_ranks(leaving_inputs_unchanged(candidate), [[_decode(a, arrays, p) for a in rank] for rank in call["ranks"]])
    elif call["kind"] == "optimizer":
        # An optimizer class: built on fresh parameters, stepped with the sent gradients (run_optimizer).
        out = run_optimizer(candidate, *args, **kwargs)
    elif call["kind"] == "loader":
        # A weight loader fills a bare module that has exactly the asked parameter names and shapes.
        target = bare_module(call["shapes"], getattr(torch, call["dtype"]))
        candidate(target, *args, **kwargs)
        out = [(name, p.detach()) for name, p in sorted(target.named_parameters())]
    else:
        raise ValueError(f"unknown case kind {call['kind']!r}")
    result = _wire.flatten_result(out)
    if "requires_grad" in call:                        # the server judges the history: a last one-value output
        tensors = out if isinstance(out, (tuple, list)) else (out,)
        result.append(np.array(any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)))
    if grad:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        cots = [torch.from_numpy(arrays[f"{p}/{c}"].copy()) for c in grad["cotangents"]]
        total = sum((outs[o] * c).sum() for o, c in zip(grad["outputs"], cots))
        grads = torch.autograd.grad(total, [args[j] for j in grad["args"]], allow_unused=True)
        result += [np.zeros(args[j].shape, dtype=args[j].detach().numpy().dtype) if g is None else g.numpy()
                   for j, g in zip(grad["args"], grads)]
    return result


def run_optimizer(cls, groups, defaults, steps):
    """What an optimizer class does, step by step: the "optimizer" case kind (chapter 09's AdamW).

    groups: [{"params": [tensors], option: value, ...}] (the param groups; each tensor becomes a fresh
    nn.Parameter), defaults: keyword arguments of ``cls`` (lr, betas, ...), steps: [{"lr": [one per
    group], "grads": [one per parameter, in group order: a tensor or None]}].  Before each step every
    group's "lr" is set (as a schedule does) and every parameter's .grad; then ``step()``.  Returns,
    after each step and for each parameter: its value, state["exp_avg"] and state["exp_avg_sq"] (zeros
    while it has no state) and state["step"] as a float64 number."""
    params = [[torch.nn.Parameter(t.detach().clone()) for t in g["params"]] for g in groups]
    opt = cls([{**{k: v for k, v in g.items() if k != "params"}, "params": ps} for g, ps in zip(groups, params)],
              **defaults)
    flat = [p for ps in params for p in ps]
    out = []
    for step in steps:
        for group, lr in zip(opt.param_groups, step["lr"]):
            group["lr"] = lr
        for p, g in zip(flat, step["grads"]):
            p.grad = None if g is None else g.detach().clone()
        opt.step()
        for p in flat:
            state = opt.state[p] if p in opt.state else {}
            out += [p.detach().clone()]
            out += [torch.as_tensor(state[k]).detach().clone() if k in state else torch.zeros_like(p.detach())
                    for k in ("exp_avg", "exp_avg_sq")]
            out.append(torch.tensor(float(state.get("step", 0)), dtype=torch.float64))
    return out


def _raised(candidate, args, kwargs, expected):
    """A case that expects an exception (a built-in's name): True if the call raised it, else False."""
    import builtins
    try:
        candidate(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:
        wanted = getattr(builtins, expected, None)
        return np.asarray(isinstance(exc, wanted) if isinstance(wanted, type) else type(exc).__name__ == expected)
    return np.asarray(False)


def _load_state(module, state):
    mine = {k: list(v.shape) for k, v in module.state_dict().items()}
    wanted = {k: list(v.shape) for k, v in state.items()}
    if mine != wanted:
        raise AssertionError(f"the module's parameters are {mine}, but the exercise asks for {wanted} "
                             "(names and shapes must match exactly so the reference weights can be loaded)")
    module.load_state_dict(state)


def bare_module(shapes, dtype):
    """A module with exactly these parameters ({dotted name: shape}, zeros) and no forward, for a
    weight loader to fill: 'h.0.attn.c_attn.weight' becomes h[0].attn.c_attn.weight, children
    named 0, 1, ... form an nn.ModuleList."""
    tree = {}
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = shape

    def build(node):
        if all(k.isdigit() and isinstance(v, dict) for k, v in node.items()):
            return torch.nn.ModuleList(build(node[str(i)]) for i in range(len(node)))
        module = torch.nn.Module()
        for k, v in node.items():
            if isinstance(v, dict):
                module.add_module(k, build(v))
            else:
                module.register_parameter(k, torch.nn.Parameter(torch.zeros(v, dtype=dtype)))
        return module
    return build(tree)


class _ReferenceWatch:
    """Notices any call into the reference package's code while the submission runs."""

    def __init__(self):
        self.ref_dir = _reference_dir()
        self.hit = None

    def __call__(self, frame, event, arg):
        if event == "call" and self.hit is None and frame.f_code.co_filename.startswith(self.ref_dir):
            self.hit = frame.f_code.co_name

    @contextlib.contextmanager
    def watching(self):
        if self.ref_dir is None:
            yield
            return
        previous = sys.getprofile()
        sys.setprofile(self)
        try:
            yield
        finally:
            sys.setprofile(previous)


def _run_guarded(i, call, arrays, candidate, watch, forbid, test_id, allow=None):
    """Run one case; returns (result dict, outputs dict)."""
    from .forbid import forbidding
    watching = watch.watching if watch else contextlib.nullcontext
    noise = io.StringIO()
    try:
        # Warnings and stderr from the submission are kept out of the test cell: nbgrader
        # scores any stderr in a test cell as a failure, even a harmless warning.  So is what it prints:
        # a print of the hidden case's inputs would reach the autograded notebook and the feedback.
        with watching(), contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise), \
                warnings.catch_warnings(), \
                forbidding(forbid, test_id.split(".", 1)[-1], allow):
            warnings.simplefilter("ignore")
            got = _run_case(i, call, arrays, candidate)
    except NotImplementedError:
        return {"error": "NotImplementedError (the exercise is not done yet)"}, {}
    except Exception as exc:  # the learner's bug: report it, keep grading other cases
        return {"error": f"{type(exc).__name__}: {exc}"}, {}
    return {"n": len(got)}, {f"c{i}/out{j}": arr for j, arr in enumerate(got)}


def run_hidden_test(test_id, candidate, watch=None):
    """Run ``candidate`` on the server's cases for ``test_id``; return the verdict
    {'n_cases': int, 'failures': [str]}.  ``watch`` (a _ReferenceWatch) sees every call."""
    server = start_server()
    _wire.send(server.wfile, {"test": test_id})
    meta, arrays = _wire.recv(server.rfile)
    if "error" in meta:
        raise RuntimeError(translate(meta["error"]))
    if "replay" in meta:        # an earlier kernel of this grading run was answered: its verdict stands
        return meta["replay"]
    forbid = meta.get("forbid", [])
    allow = meta.get("allow")
    allow = None if allow is None else frozenset(allow)
    results, outputs = [], {}
    for i, call in enumerate(meta["cases"]):
        if "peak_bytes" in call:
            # Memory-bounded case: the server sends its inputs only now, measures this process's
            # peak resident memory and the memory it touches while it runs, and takes the outputs with
            # the 'end'.  Python's garbage collector is held meanwhile: a full collection reads every
            # object of the kernel's heap, which would count as touched.
            collecting = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                _wire.send(server.wfile, {"begin": i})
                _, case_arrays = _wire.recv(server.rfile)
                res, out = _run_guarded(i, call, {**arrays, **case_arrays}, candidate, watch, forbid, test_id, allow)
                _wire.send(server.wfile, {"end": i}, out)
                _wire.recv(server.rfile)
            finally:
                if collecting:
                    gc.enable()
        else:
            res, out = _run_guarded(i, call, arrays, candidate, watch, forbid, test_id, allow)
            outputs.update(out)
        results.append(res)
    _wire.send(server.wfile, {"results": results}, outputs)
    verdict, _ = _wire.recv(server.rfile)
    return verdict


def grade(test_id, candidate):
    """Hidden test cell entry point: raise AssertionError saying what is wrong, print a line if all passed."""
    imported = sorted(m for m in sys.modules if m == _REF_PACKAGE or m.startswith(_REF_PACKAGE + "."))
    if imported:
        raise AssertionError(translate(f"the submission imported the course's reference package ({imported[0]}); "
                                       "submissions must not use it"))
    watch = _ReferenceWatch()
    verdict = run_hidden_test(test_id, candidate, watch)
    if watch.hit:
        raise AssertionError(translate(f"the submission called the course's reference code ({watch.hit}); "
                                       "submissions must not use it"))
    failures = verdict["failures"]
    if failures:
        more = [translate(f"... and {len(failures) - 3} more")] if len(failures) > 3 else []
        shown = "\n  ".join(failures[:3] + more)
        raise AssertionError(translate(f"hidden test {test_id}: {len(failures)} of {verdict['n_cases']} randomized "
                                       f"cases failed:\n  {shown}"))
    print(translate(f"hidden test {test_id}: all {verdict['n_cases']} randomized cases passed"))
