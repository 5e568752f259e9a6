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

A denylist misses routes (a private kernel such as ``aten::_masked_softmax``, a composite such as
``F.rms_norm`` or ``F.multi_head_attention_forward`` that decomposes into allowed operators), so an
exercise whose answer is a short elementary computation also declares what it **may** run: ``allow``,
a set of names (``ELEMENTARY`` and the exercise's own additions) that every call the learner's code makes
and every operator the dispatcher runs must be in.  An unlisted route then fails by construction.  The
set is checked against the reference's own trace (tests/test_grading.py).
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


# What an elementary computation runs: arithmetic, comparisons, reductions, products, shapes and indexing,
# creation and conversion, and what the hidden tests' own harness runs around the learner's call (building
# modules, gradients, reading the outputs back).  Names as ``operator_name`` gives them, at both levels (a
# Python call's name, an ATen operator's); in-place variants (``add_``), dunder methods (``__add__``,
# ``__getitem__``, property getters) and autograd's backward kernels are allowed with them (see ``allowed``).
ELEMENTARY = frozenset("aten::" + n for n in (
    "add", "sub", "rsub", "mul", "multiply", "div", "divide", "true_divide", "floor_divide", "remainder", "fmod",
    "neg", "negative", "reciprocal",
    "pow", "float_power", "square", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "abs",
    "absolute", "sign", "sgn",
    "clamp", "clamp_min", "clamp_max", "clip", "maximum", "minimum", "fmax", "fmin", "floor", "ceil", "round",
    "trunc", "frac", "lerp", "addcmul", "addcdiv",
    "sin", "cos", "tanh", "sigmoid", "erf", "where", "masked_fill", "nan_to_num", "isnan", "isinf", "isfinite",
    "isneginf", "isposinf",
    "eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal", "equal",
    "allclose", "isclose",
    "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not",
    "bitwise_xor",
    "sum", "nansum", "mean", "prod", "max", "min", "amax", "amin", "aminmax", "argmax", "argmin", "var", "std",
    "var_mean", "std_mean", "all", "any",
    "count_nonzero", "norm", "linalg_vector_norm", "cumsum", "cumprod", "sort", "argsort", "topk",
    "matmul", "mm", "bmm", "mv", "dot", "vdot", "addmm", "addbmm", "baddbmm", "addmv", "einsum", "outer", "ger",
    "tensordot", "linear",
    "view", "view_as", "reshape", "reshape_as", "_unsafe_view", "_reshape_alias", "permute", "transpose",
    "swapaxes", "swapdims", "movedim",
    "moveaxis", "t", "contiguous", "expand", "expand_as", "broadcast_to", "broadcast_tensors", "repeat",
    "repeat_interleave", "tile",
    "unsqueeze", "squeeze", "flatten", "unflatten", "narrow", "slice", "select", "index", "index_select",
    "index_put", "index_add", "gather",
    "scatter", "scatter_add", "take_along_dim", "masked_select", "nonzero", "one_hot", "cat", "concat",
    "concatenate", "stack", "hstack", "vstack",
    "split", "split_with_sizes", "chunk", "unbind", "tensor_split", "flip", "roll", "tril", "triu", "diagonal",
    "diag", "diag_embed",
    "clone", "copy", "detach", "alias", "as_strided", "unfold",
    "zeros", "ones", "full", "empty", "empty_strided", "empty_like", "zeros_like", "ones_like", "full_like",
    "arange", "linspace", "eye",
    "tensor", "as_tensor", "from_numpy", "scalar_tensor", "lift_fresh", "lift_fresh_copy", "new_zeros", "new_ones",
    "new_full", "new_empty",
    "new_tensor", "new_empty_strided", "fill", "zero", "tril_indices", "triu_indices", "rand", "randn", "randint",
    "randperm", "normal", "uniform",
    "bernoulli", "multinomial",
    "to", "_to_copy", "_parse_to", "type", "type_as", "float", "double", "half", "bfloat16", "long", "int", "bool",
    "item", "_local_scalar_dense",
    "is_nonzero", "_is_any_true", "_is_all_true", "cpu", "numpy", "tolist", "size", "dim", "numel", "stride",
    "storage_offset", "is_contiguous",
    "is_floating_point", "is_complex", "element_size", "result_type", "can_cast", "promote_types", "is_same_size",
    "requires_grad", "backward", "grad", "retain_grad", "_set_grad_enabled", "_has_compatible_shallow_copy_type",
    "_make_subclass",
))
# The optimizer base class records each step for the profiler.
_ALWAYS_NAMESPACES = ("profiler::",)


def allowed(name, allow):
    """Whether ``name`` (as ``operator_name`` gives it) is in ``allow``, counting an in-place variant
    (``aten::add_``) as its operator, a dunder method (``aten::__add__``, a property's ``__get__``) as allowed,
    and autograd's backward kernels (``aten::_softmax_backward_data``), which compute gradients of what the
    forward ran, not a forward of their own."""
    short = name.split("::", 1)[-1]
    if (short.startswith("__") and short.endswith("__")) or name.startswith(_ALWAYS_NAMESPACES):
        return True
    if short.endswith(("_backward", "_backward_data")):
        return True
    return name in allow or name.rstrip("_") in allow


def _operator_guard(operators, exercise, allow=None):
    """A context that raises ForbiddenCall on any of ``operators`` (ATen names), at both levels, and, with
    ``allow``, on anything not in it."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    def refuse(func):
        name = operator_name(func)
        if name in operators:
            raise ForbiddenCall(f"{exercise} must be written from scratch: it may not call {name} "
                                f"(as {getattr(func, '__name__', name)})")
        if allow is not None and not allowed(name, allow):
            raise ForbiddenCall(f"{exercise} must be written from scratch, from elementary operations: "
                                f"it may not call {name} (as {getattr(func, '__name__', name)})")

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
def forbidding(paths, exercise, allow=None):
    """Make each built-in in ``paths`` (ATen operators "aten::..." and dotted Python paths) raise
    ForbiddenCall while the block runs, and, with ``allow`` (names as ``operator_name`` gives them), every
    call and operator not in it; restore after."""
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
        with (_operator_guard(operators, exercise, allow) if operators or allow is not None
              else contextlib.nullcontext()):
            yield
    finally:
        for owner, name, value, own in reversed(saved):
            if own:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
