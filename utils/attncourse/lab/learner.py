"""Your code, as the training program sees it: export from the notebook, load and check in the trainer.

The training program has to be a file (torchrun starts it once per GPU), but you write your
pieces in the notebook.  ``export(path, obj, ...)`` copies the notebook cells that define the
given functions and classes into one module (``mylab.py``); ``load(path)`` imports it in the
trainer and checks that everything is there, with messages that say what to fix.
"""
import ast
import importlib.util
import inspect
import linecache
from pathlib import Path

import torch

from ..i18n import translate

# What the trainer calls, in the order the notebook defines them.
FUNCTIONS = ("lr_at", "micro_batch_loss", "clip_grad_norm", "flops_per_token", "mfu",
             "shard_indices", "all_reduce_mean")
MODEL_SIGNATURE = "GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0)"
PREAMBLE = '''"""Written by attncourse.lab.export() from the notebook: edit the notebook and export again."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
'''


class LabError(RuntimeError):
    """Something is wrong with the learner's module; the message says what and how to fix it (in the
    learner's language: attncourse.i18n)."""

    def __init__(self, message):
        super().__init__(translate(message))


def _cell_source(obj):
    """The source of the notebook cell (or script) that defined ``obj``, a function or class of __main__."""
    codes = []
    if inspect.isfunction(obj):
        codes.append(obj.__code__)
    elif inspect.isclass(obj):
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)
            if inspect.isfunction(value):
                codes.append(value.__code__)
    for code in codes:
        lines = linecache.getlines(code.co_filename)
        if lines:
            return code.co_filename, "".join(lines)
    raise LabError(f"cannot find the source of {getattr(obj, '__name__', obj)!r}: define it in a notebook cell "
                   "and export again")


def _definitions(source):
    """The top-level imports, functions, classes and plain aliases/constants of a cell, as source text.

    Statements that do something (prints, training runs, plots) are left out, so importing the
    exported module only defines things.
    """
    tree = ast.parse(source)
    keep = []
    for node in tree.body:
        simple_value = isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
            getattr(node, "value", None), (ast.Constant, ast.Name, ast.Attribute))
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                or simple_value:
            keep.append(ast.get_source_segment(source, node, padded=True)
                         if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         else _with_decorators(source, node))
    return "\n\n".join(keep)


def _with_decorators(source, node):
    lines = source.splitlines()
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return "\n".join(lines[first - 1: node.end_lineno])


def export(path, *objects, **named):
    """Write the notebook cells that define ``objects`` (and ``named`` ones) to the module at ``path``.

    ``export("mylab.py", lr_at, clip_grad_norm, GPT=MyModel)``: each defining cell is copied once,
    keeping only its definitions (imports, functions, classes, constants); an object passed by
    keyword is also made available under that name.  Something imported from an installed
    module (the fallback model, say) is exported as that import.  A standard preamble imports
    math, torch, torch.nn (nn), torch.nn.functional (F) and torch.distributed (dist).
    Returns the path written.
    """
    path = Path(path)
    seen, parts, aliases = set(), [PREAMBLE], []
    for name, obj in [(getattr(o, "__name__", None), o) for o in objects] + list(named.items()):
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            raise LabError(f"export() takes functions and classes; {name!r} is a {type(obj).__name__}")
        if obj.__module__ != "__main__":
            alias = "" if obj.__name__ == name else f" as {name}"
            parts.append(f"from {obj.__module__} import {obj.__qualname__}{alias}")
            continue
        where, source = _cell_source(obj)
        if where not in seen:
            seen.add(where)
            parts.append(_definitions(source))
        if obj.__name__ != name:
            aliases.append(f"{name} = {obj.__name__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n\n".join(p.strip("\n") for p in parts + aliases) + "\n")
    return path


def load(path, need=FUNCTIONS):
    """Import the learner's module from ``path`` and check it defines ``need``; returns the module."""
    path = Path(path)
    if not path.exists():
        raise LabError(f"no {path.name} in {path.resolve().parent}: run the export cell of the chapter 09 notebook "
                       "(it writes your functions and your GPT to mylab.py), or pass --code PATH")
    spec = importlib.util.spec_from_file_location("mylab", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise LabError(f"importing {path} failed with {type(exc).__name__}: {exc}. Fix the cell in the notebook "
                       "and export again") from exc
    missing = [name for name in need if not callable(getattr(module, name, None))]
    if missing:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == "mylab")
        raise LabError(f"{path.name} does not define {', '.join(missing)} (it defines: {', '.join(defined) or 'nothing'}). "
                       "Export all the exercise cells again")
    return module


def model_class(module, name="GPT"):
    """The model class ``name`` of the learner's module, with a message naming the classes it does have."""
    cls = getattr(module, name, None)
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        return cls
    classes = sorted(n for n, v in vars(module).items()
                     if isinstance(v, type) and issubclass(v, torch.nn.Module))
    found = f"its nn.Module classes are {', '.join(classes)}" if classes else "it defines no nn.Module class"
    raise LabError(f"{getattr(module, '__file__', 'mylab.py')} has no model class {name!r} ({found}). Name your "
                   f"chapter 06 model {name} (or pass --model-class NAME), or train the built-in one with --model fallback")


def optimizer_class(module, name="AdamW"):
    """The learner's optimizer class (``--optimizer mine``), with a message saying what is wrong."""
    cls = getattr(module, name, None)
    if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
        return cls
    raise LabError(f"{getattr(module, '__file__', 'mylab.py')} has no optimizer class {name!r} (a subclass of "
                   "torch.optim.Optimizer): export your AdamW cell with the others, or train with --optimizer torch")


def check_model(cls, vocab_size=11, block_size=8):
    """Build a tiny instance of ``cls`` and check that forward(idx [B, T]) returns logits [B, T, vocab_size]."""
    try:
        model = cls(vocab_size=vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
    except TypeError as exc:
        raise LabError(f"{cls.__name__}(...) must accept the arguments {MODEL_SIGNATURE}: {exc}") from exc
    idx = torch.randint(0, vocab_size, (2, block_size))
    try:
        with torch.no_grad():
            out = model(idx)
    except Exception as exc:
        raise LabError(f"{cls.__name__}.forward(idx) with idx a [2, {block_size}] long tensor raised "
                       f"{type(exc).__name__}: {exc}") from exc
    if isinstance(out, (tuple, list)):
        raise LabError(f"{cls.__name__}.forward(idx) returns a {type(out).__name__}; the lab needs the logits alone, "
                       f"a [B, T, vocab_size] tensor (it computes the loss itself)")
    if not isinstance(out, torch.Tensor):
        raise LabError(f"{cls.__name__}.forward(idx) should return a tensor of logits, got {type(out).__name__}")
    if tuple(out.shape) != (2, block_size, vocab_size):
        hint = ""
        if tuple(out.shape) == (2, vocab_size):
            hint = ": it returns the last position only; return the logits of every position"
        elif tuple(out.shape) == (2 * block_size, vocab_size):
            hint = ": keep the batch and time dimensions separate"
        raise LabError(f"{cls.__name__}.forward(idx [2, {block_size}]) returned shape {list(out.shape)}; expected "
                       f"logits [B, T, vocab_size] = [2, {block_size}, {vocab_size}]{hint}")
    if not out.is_floating_point():
        raise LabError(f"{cls.__name__}.forward(idx) returned {out.dtype}; logits must be floating point")
    return model
