"""Built-ins a from-scratch exercise may not call.

An exercise that re-implements something PyTorch already has (softmax, layer norm, gradient
clipping, ...) names what it forbids in two ways:
- **operators**, "aten::_softmax": PyTorch's own name for the operation, whatever Python spelling
  reached it (``torch.softmax``, ``Tensor.softmax``, ``F.softmin``, ``nn.Softmax``,
  ``torch.ops.aten._softmax``...).  While the learner's code runs under ``forbidding(...)`` a
  ``TorchFunctionMode`` sees every call of a composite operator by its ATen name (``torch.ops`` calls
  included) and a ``TorchDispatchMode`` every operator the dispatcher actually runs; either raises
  ``ForbiddenCall`` on a forbidden one.
- **dotted paths**, "torch.nn.functional.layer_norm": Python objects (classes, helpers written in
  Python) that are replaced by a stub while the block runs; they also name the built-in in messages.
The grader also reads the submitted source for both (tools/grade_class.py), for the audit.
"""
import contextlib
import importlib


class ForbiddenCall(RuntimeError):
    """Learner code called a built-in that the exercise asks to write from scratch."""


def _owner(path):
    """(object that holds the attribute, attribute name) for a dotted path, or None if absent."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            obj = getattr(obj, name, None)
            if obj is None:
                return None
        return (obj, parts[-1]) if hasattr(obj, parts[-1]) else None
    return None


def _blocked(path, exercise):
    def blocked(*args, **kwargs):
        raise ForbiddenCall(f"{exercise} must be written from scratch: it may not call {path}")
    blocked.__name__ = path.rsplit(".", 1)[-1]
    return blocked


def operator_name(func):
    """"aten::<name>" for an ATen operator or a function that stands for one (F.rms_norm, Tensor.softmax)."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return schema.name
    qualified = getattr(func, "_qualified_op_name", None)
    if qualified:
        return qualified
    return "aten::" + getattr(func, "__name__", "").split(".")[0]


def _operator_guard(operators, exercise):
    """A context that raises ForbiddenCall on any of ``operators`` (ATen names), at both levels."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    def refuse(func):
        name = operator_name(func)
        if name in operators:
            raise ForbiddenCall(f"{exercise} must be written from scratch: it may not call {name} "
                                f"(as {getattr(func, '__name__', name)})")

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            refuse(func)
            return func(*args, **(kwargs or {}))

    class Operators(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # Else torch wraps __torch_dispatch__ to keep torch.compile out of it, which imports torch._dynamo
            # on the first call: 1.5 s of every learner's first check (nothing here is ever compiled).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            refuse(func)
            return func(*args, **(kwargs or {}))

    stack = contextlib.ExitStack()
    stack.enter_context(Functions())
    stack.enter_context(Operators())
    return stack


@contextlib.contextmanager
def forbidding(paths, exercise):
    """Make each built-in in ``paths`` (ATen operators "aten::..." and dotted Python paths) raise
    ForbiddenCall while the block runs; restore after."""
    operators = frozenset(p for p in paths if p.startswith("aten::"))
    saved = []
    try:
        for path in paths:
            if path in operators:
                continue
            found = _owner(path)
            if found is None:
                continue
            owner, name = found
            own = name in vars(owner)          # else inherited (e.g. Tensor.softmax from TensorBase)
            saved.append((owner, name, vars(owner).get(name), own))
            setattr(owner, name, _blocked(path, exercise))
        with (_operator_guard(operators, exercise) if operators else contextlib.nullcontext()):
            yield
    finally:
        for owner, name, value, own in reversed(saved):
            if own:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
