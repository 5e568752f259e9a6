"""Built-ins a from-scratch exercise may not call.

An exercise that re-implements something PyTorch already has (softmax, layer norm, gradient
clipping, ...) names the built-ins it forbids as dotted paths, e.g. "torch.nn.functional.layer_norm".
While the learner's code runs under ``forbidding(...)`` each of them raises ``ForbiddenCall``.
The grader also reads the submitted source for them (tools/grade_class.py), so code that
restores a built-in before calling it is caught there.
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


@contextlib.contextmanager
def forbidding(paths, exercise):
    """Make each built-in in ``paths`` raise ForbiddenCall while the block runs; restore after."""
    saved = []
    try:
        for path in paths:
            found = _owner(path)
            if found is None:
                continue
            owner, name = found
            own = name in vars(owner)          # else inherited (e.g. Tensor.softmax from TensorBase)
            saved.append((owner, name, vars(owner).get(name), own))
            setattr(owner, name, _blocked(path, exercise))
        yield
    finally:
        for owner, name, value, own in reversed(saved):
            if own:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
