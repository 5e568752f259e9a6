"""Listing the matrix products a computation runs, with their shapes and FLOPs (chapter 05's cost table).

``matrix_products(fn, *args)`` runs ``fn`` once under PyTorch's profiler with ``record_shapes`` and
``with_flops``: the profiler counts 2 FLOPs per multiply-add of every matrix product it sees.
Attention runs with PyTorch's plain "math" kernel, so that the score product Q K^T and the weighted
sum A V appear as two separate batched products; the fused kernels do the same arithmetic in one call.
"""
from torch.nn.attention import SDPBackend, sdpa_kernel

from .memory import _quiet_fd2, cpu_profile

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def matrix_products(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` once; return [(op, [operand shapes], FLOPs)] for each matrix product, in order."""
    with _quiet_fd2(), sdpa_kernel(SDPBackend.MATH), cpu_profile(record_shapes=True, with_flops=True) as prof:
        fn(*args, **kwargs)
    return [(e.name, [list(s) for s in e.input_shapes if len(s) >= 2], int(e.flops))
            for e in prof.function_events if e.name in MATMULS]
