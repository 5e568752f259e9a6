"""What the hardware could do at best: peak FLOP/s, the denominator of model FLOPs utilisation.

GPU peaks are the dense (no sparsity) bfloat16/float16 tensor-core figures of the vendors'
datasheets, per GPU.  The table is matched against torch.cuda.get_device_name(); override it
with --peak-tflops (or $ATTNCOURSE_PEAK_TFLOPS) for a GPU it does not list, a different clock,
or to use another convention.  A CPU has no single datasheet number that PyTorch reaches, so
on a CPU the lab measures how fast a large float32 matrix product runs and reports MFU
against that.
"""
import os
import time

import torch

# Name fragment -> dense bf16/fp16 tensor-core peak, TFLOP/s per GPU.  First match wins, so the
# more specific names come first.
PEAK_TFLOPS = [
    ("B200", 2250.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),          # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),           # A10 (not A10G, whose figure NVIDIA does not publish)
    ("RTX 6000 Ada", 364.0),
    ("RTX A6000", 155.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),          # float16; no bfloat16 on Volta
    ("T4", 65.0),             # float16; no bfloat16 on Turing
]


def gpu_peak_tflops(name):
    """The table's peak for a device name like 'NVIDIA A100-SXM4-80GB', or None."""
    if "A10G" in name:
        return None
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops
    return None


def measure_matmul_tflops(n=1024, trials=5, dtype=torch.float32):
    """TFLOP/s of an [n x n] @ [n x n] product on the CPU: the best of a few timed trials (a practical,
    measured peak; the best trial is the one least disturbed by whatever else the machine is doing)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b                                      # warm up
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        a @ b
        a @ b
        best = min(best, (time.perf_counter() - start) / 2)
    return 2 * n ** 3 / best / 1e12


def peak_flops(device, override=None):
    """(peak FLOP/s of one device, where the number comes from)."""
    override = override or os.environ.get("ATTNCOURSE_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12, "given"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tflops = gpu_peak_tflops(name)
        if tflops is None:
            return None, f"{name} is not in the peak table: pass --peak-tflops"
        return tflops * 1e12, f"{name}, datasheet"
    return measure_matmul_tflops() * 1e12, "this CPU's measured float32 matmul speed"
