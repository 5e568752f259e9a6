"""The hardware: which device the lab trains on, what that device can do, and its peak FLOP/s.

Which device (``--device``): ``auto`` takes a CUDA GPU, else Apple's GPU (MPS, on a Mac with
Apple silicon), else the CPU; ``cuda``, ``mps`` and ``cpu`` insist, and fail with a message that
says why where the device is missing.  Each GPU-recipe setting is then chosen for the device, and
what the device cannot do falls back with a note instead of a crash: bfloat16 autocast (MPS: only
where a probe shows it works, else float32), torch.compile (CUDA only), fused AdamW (CUDA and
MPS, non-fused where PyTorch refuses it), DDP's backend (NCCL for CUDA where PyTorch has it, else
gloo; MPS serves one process).  Operators that MPS lacks run on the CPU
(PYTORCH_ENABLE_MPS_FALLBACK=1, set by ``attncourse.lab`` before torch is imported).

Peak FLOP/s, the denominator of model FLOPs utilisation:

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

from .learner import LabError

DEVICES = ("auto", "cuda", "mps", "cpu")

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


def _synchronize(device):
    if device.type == "mps":
        torch.mps.synchronize()


def measure_matmul_tflops(n=1024, trials=5, dtype=torch.float32, device="cpu"):
    """TFLOP/s of an [n x n] @ [n x n] product on ``device`` (the CPU, or Apple's GPU): the best of a few
    timed trials (a practical, measured peak; the best trial is the one least disturbed by whatever
    else the machine is doing)."""
    device = torch.device(device)
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b                                      # warm up
    _synchronize(device)
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        a @ b
        a @ b
        _synchronize(device)                   # a GPU returns before the product is done
        best = min(best, (time.perf_counter() - start) / 2)
    return 2 * n ** 3 / best / 1e12


def peak_flops(device, override=None, dtype=None):
    """(peak FLOP/s of one device, where the number comes from).  ``dtype``: the run's autocast dtype, in
    which Apple's GPU is measured (None: float32)."""
    override = override or os.environ.get("ATTNCOURSE_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12, "given"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tflops = gpu_peak_tflops(name)
        if tflops is None:
            return None, f"{name} is not in the peak table: pass --peak-tflops"
        return tflops * 1e12, f"{name}, datasheet"
    if device.type == "mps":
        # Apple publishes no tensor-core-style peak; the measured speed is the practical one.
        dtype = dtype or torch.float32
        kind = str(dtype).removeprefix("torch.")
        return measure_matmul_tflops(dtype=dtype, device=device) * 1e12, f"this Apple GPU's measured {kind} matmul speed"
    return measure_matmul_tflops() * 1e12, "this CPU's measured float32 matmul speed"


# ---- which device, and what it can do ----------------------------------------------------------

def mps_available():
    """True where PyTorch can use Apple's GPU (Metal Performance Shaders)."""
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _mps_missing():
    """Why Apple's GPU cannot be used here, in words."""
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return "this PyTorch was built without MPS (PyTorch's macOS builds have it)"
    return "PyTorch has MPS but finds no usable Apple GPU (it needs a Mac with Apple silicon and macOS 12.3 or later)"


def choose_device(requested="auto", local_rank=0, processes=1):
    """(torch.device, why it was chosen): CUDA, then Apple's GPU (MPS), then the CPU, or the one asked for.

    ``processes``: how many processes train together (torchrun's WORLD_SIZE).  Raises LabError where
    the device asked for is not there.
    """
    if requested not in DEVICES:
        raise LabError(f"--device {requested}: choose one of {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise LabError("--device cuda: PyTorch finds no CUDA GPU here (no NVIDIA GPU or driver, or a CPU-only build of PyTorch); use --device auto to train on what there is")
    if requested == "mps" and not mps_available():
        raise LabError(f"--device mps: Apple's GPU (MPS) cannot be used here: {_mps_missing()}; use --device auto or --device cpu")
    if requested == "mps" and processes > 1:
        raise LabError(f"--device mps: {processes} processes cannot share Apple's GPU (gloo, the only backend there, has no MPS collectives); run one process, or --device cpu under torchrun")
    if requested == "cuda" or (requested == "auto" and cuda):
        device = torch.device("cuda", local_rank)
        name = torch.cuda.get_device_name(device)
        if requested == "cuda":
            return device, f"{name}, asked for with --device cuda"
        return device, f"{name}, a CUDA GPU: the first choice of --device auto"
    if requested == "mps":
        return torch.device("mps"), "Apple's GPU (MPS), asked for with --device mps"
    if requested == "cpu":
        return torch.device("cpu"), "asked for with --device cpu"
    if mps_available():
        if processes > 1:
            return torch.device("cpu"), f"Apple's GPU (MPS) serves one process, not {processes}: the CPU for all of them"
        return torch.device("mps"), "Apple's GPU (MPS): no CUDA GPU, and --device auto takes MPS before the CPU"
    return torch.device("cpu"), "no CUDA GPU and no Apple GPU (MPS) here: the CPU"


def autocast_error(device, dtype):
    """None where a forward and backward pass under ``dtype`` autocast work on ``device`` (with the loss
    scaler that float16 needs), else what went wrong, in one line."""
    try:
        w = torch.randn(8, 8, device=device, requires_grad=True)
        with torch.autocast(device_type=device.type, dtype=dtype):
            loss = (torch.randn(4, 8, device=device) @ w).float().square().mean()
        if dtype == torch.float16:
            loss = torch.amp.GradScaler(device.type).scale(loss)
        loss.backward()
        _synchronize(device)
    except Exception as exc:                   # noqa: BLE001  (any failure means: not on this device)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def autocast_dtype(device, requested="auto"):
    """(the autocast dtype or None for float32, a note where the device forced a fallback, else None).

    auto: bfloat16 on a CUDA GPU that has it, else float16 (with loss scaling); bfloat16 on Apple's
    GPU where it works there; float32 on the CPU.  On Apple's GPU a dtype is probed first: autocast
    there depends on the PyTorch and macOS versions.
    """
    if requested == "auto":
        if device.type == "cuda":
            requested = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        elif device.type == "mps":
            requested = "bfloat16"
        else:
            requested = "float32"
    if requested == "float32":
        return None, None
    dtype = getattr(torch, requested)
    if device.type == "mps":
        error = autocast_error(device, dtype)
        if error:
            return None, f"{requested} autocast does not work on Apple's GPU with this PyTorch and macOS ({error}): training in float32"
    return dtype, None


def compile_choice(device, requested="auto"):
    """(use torch.compile, a note where the device forced it off, else None): on for CUDA under auto."""
    if device.type == "mps" and requested == "on":
        return False, "torch.compile is not used on Apple's GPU (MPS): its support there is experimental; running eagerly"
    return requested == "on" or (requested == "auto" and device.type == "cuda"), None


def fused_adamw(device):
    """Whether to ask AdamW for its fused kernel (one kernel for the whole update): on GPUs."""
    return device.type in ("cuda", "mps")


def dist_backend(device):
    """(torch.distributed backend for DDP on ``device``, a note where NCCL was wanted but is missing)."""
    if device.type != "cuda":
        return "gloo", None
    import torch.distributed as dist
    if dist.is_nccl_available():
        return "nccl", None
    return "gloo", "this PyTorch has no NCCL (Windows builds do not): DDP over gloo, slower between GPUs"
