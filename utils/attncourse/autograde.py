"""Client side of the hidden tests.  A hidden test cell calls ``grade("ch02.causal_mask", causal_mask)``.

The reference answers and the comparison live in a separate, fresh Python process (the
grading server, ``python -I -m attncourse_ref.grading``): this kernel only runs the
submission on the inputs it is sent and sends back what came out.  What the client still
checks in this kernel is that the submission did not lean on the reference package.

Known limit: code that runs in the same kernel can, in principle, replace this module's
functions too.  ``tools/grade_class.py`` therefore also audits every submission's source for
such tampering and lists what it finds next to the grades.
"""
import atexit
import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import warnings

import numpy as np
import torch

from . import _wire

_REF_PACKAGE = "attncourse_ref"
_server = None


def start_server():
    global _server
    if _server is not None and _server.poll() is None:
        return _server
    env = {k: v for k, v in os.environ.items() if k != "ATTNCOURSE_GRADING_KERNEL"}
    env.setdefault("OMP_NUM_THREADS", "1")
    _server = subprocess.Popen([sys.executable, "-I", "-m", "attncourse_ref.grading"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    atexit.register(_server.kill)
    return _server


def _reference_dir():
    spec = importlib.util.find_spec(_REF_PACKAGE)      # finds it without importing it
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def _decode(ref, arrays, prefix):
    if "a" in ref:
        return torch.from_numpy(arrays[f"{prefix}/{ref['a']}"].copy())
    return ref["v"]


def _to_numpy_list(out):
    items = out if isinstance(out, (tuple, list)) else (out,)
    res = []
    for item in items:
        if isinstance(item, torch.Tensor):
            res.append(item.detach().cpu().numpy())
        else:
            arr = np.asarray(item)
            if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
                raise TypeError(f"returned a {type(item).__name__}; expected tensors or numbers")
            res.append(arr)
    return res


def _run_case(i, call, arrays, candidate):
    from .layers import make_layer
    p = f"c{i}"
    args = [_decode(a, arrays, p) for a in call["args"]]
    kwargs = {k: _decode(v, arrays, p) for k, v in call["kwargs"].items()}
    grad = call.get("grad")
    if grad:
        for j in grad["args"]:
            args[j] = args[j].requires_grad_(True)
    if call["kind"] == "function":
        out = _raised(candidate, args, kwargs, call["raises"]) if call.get("raises") else candidate(*args, **kwargs)
    elif call["kind"] == "module":
        module = candidate(**call["init"]).to(getattr(torch, call["dtype"]))
        state = {name: torch.from_numpy(arrays[f"{p}/{key}"].copy()) for name, key in call["state"].items()}
        _load_state(module, state)
        module.eval()
        with torch.no_grad():
            out = module(*args, **kwargs)
    elif call["kind"] == "layer":
        layer = make_layer(call["layer"], torch.from_numpy(arrays[f"{p}/{call['weight']}"].copy()))
        out = candidate(layer, *args, **kwargs)
    else:
        raise ValueError(f"unknown case kind {call['kind']!r}")
    result = _to_numpy_list(out)
    if grad:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        cots = [torch.from_numpy(arrays[f"{p}/{c}"].copy()) for c in grad["cotangents"]]
        total = sum((outs[o] * c).sum() for o, c in zip(grad["outputs"], cots))
        grads = torch.autograd.grad(total, [args[j] for j in grad["args"]], allow_unused=True)
        result += [np.zeros(args[j].shape, dtype=args[j].detach().numpy().dtype) if g is None else g.numpy()
                   for j, g in zip(grad["args"], grads)]
    return result


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


def run_hidden_test(test_id, candidate, watch=None):
    """Run ``candidate`` on the server's cases for ``test_id``; return the verdict
    {'n_cases': int, 'failures': [str]}.  ``watch`` (a _ReferenceWatch) sees every call."""
    server = start_server()
    _wire.send(server.stdin, {"test": test_id})
    meta, arrays = _wire.recv(server.stdout)
    if "error" in meta:
        raise RuntimeError(meta["error"])
    watching = watch.watching if watch else contextlib.nullcontext
    results, outputs = [], {}
    noise = io.StringIO()
    for i, call in enumerate(meta["cases"]):
        try:
            # Warnings and stderr from the submission are kept out of the test cell: nbgrader
            # scores any stderr in a test cell as a failure, even a harmless warning.
            with watching(), contextlib.redirect_stderr(noise), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _run_case(i, call, arrays, candidate)
        except NotImplementedError:
            results.append({"error": "NotImplementedError (the exercise is not done yet)"})
            continue
        except Exception as exc:  # the learner's bug: report it, keep grading other cases
            results.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        for j, arr in enumerate(got):
            outputs[f"c{i}/out{j}"] = arr
        results.append({"n": len(got)})
    _wire.send(server.stdin, {"results": results}, outputs)
    verdict, _ = _wire.recv(server.stdout)
    return verdict


def grade(test_id, candidate):
    """Hidden test cell entry point: raise AssertionError saying what is wrong, print a line if all passed."""
    imported = sorted(m for m in sys.modules if m == _REF_PACKAGE or m.startswith(_REF_PACKAGE + "."))
    if imported:
        raise AssertionError(f"the submission imported the course's reference package ({imported[0]}); "
                             "submissions must not use it")
    watch = _ReferenceWatch()
    verdict = run_hidden_test(test_id, candidate, watch)
    if watch.hit:
        raise AssertionError(f"the submission called the course's reference code ({watch.hit}); "
                             "submissions must not use it")
    failures = verdict["failures"]
    if failures:
        shown = "\n  ".join(failures[:3]) + (f"\n  ... and {len(failures) - 3} more" if len(failures) > 3 else "")
        raise AssertionError(f"hidden test {test_id}: {len(failures)} of {verdict['n_cases']} randomized cases "
                             f"failed:\n  {shown}")
    print(f"hidden test {test_id}: all {verdict['n_cases']} randomized cases passed")
