"""Message framing between a notebook kernel and the grading server.

A message is a JSON header plus named numpy arrays, packed as one .npz with pickling off,
so neither side ever unpickles what the other sent.
"""
import io
import json
import struct

import numpy as np

_META = "__meta__"


def pack(meta, arrays=None):
    buf = io.BytesIO()
    payload = {k: np.asarray(v) for k, v in (arrays or {}).items()}
    for k, v in payload.items():
        if v.dtype.hasobject:
            raise ValueError(f"{k}: only numeric and bool arrays cross the wire, got dtype {v.dtype}")
    payload[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buf, **payload)
    return buf.getvalue()


def unpack(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != _META}
        meta = json.loads(z[_META].tobytes().decode())
    return meta, arrays


def send(stream, meta, arrays=None):
    data = pack(meta, arrays)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the grading server closed the connection")
    (n,) = struct.unpack("<Q", head)
    return unpack(stream.read(n))


# ---- values in calls and results ------------------------------------------------------------
# Both sides use these, so the server's expected outputs and the client's results are flattened
# the same way.  Arguments may nest tuples, lists and dicts of tensors and plain values.

def encode_value(value, arrays, key):
    """A JSON reference to ``value``; tensors and arrays go into ``arrays`` under ``key``."""
    import torch
    if isinstance(value, torch.Tensor):
        arrays[key] = value.detach().cpu().numpy()
        return {"a": key}
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {"a": key}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if isinstance(value, torch.Generator):
        # A fresh generator with this seed on the other side (send only freshly seeded ones).
        return {"g": value.initial_seed()}
    if isinstance(value, (list, tuple)):
        return {"l": [encode_value(v, arrays, f"{key}.{i}") for i, v in enumerate(value)],
                "tuple": isinstance(value, tuple)}
    if isinstance(value, dict):
        return {"d": {str(k): encode_value(v, arrays, f"{key}.{k}") for k, v in value.items()}}
    raise TypeError(f"cannot send {type(value).__name__} across the grading wire")


def decode_value(ref, arrays, prefix):
    """The inverse of encode_value: arrays come back as fresh torch tensors."""
    import torch
    if "a" in ref:
        return torch.from_numpy(arrays[f"{prefix}/{ref['a']}"].copy())
    if "l" in ref:
        items = [decode_value(v, arrays, prefix) for v in ref["l"]]
        return tuple(items) if ref.get("tuple") else items
    if "d" in ref:
        return {k: decode_value(v, arrays, prefix) for k, v in ref["d"].items()}
    if "g" in ref:
        return torch.Generator().manual_seed(ref["g"])
    return ref["v"]


def flatten_result(out):
    """A call's result as a flat list of numpy arrays: tuples, lists and dicts (by sorted key) are
    walked in order; a string becomes its Unicode code points (uint32), so it is compared exactly."""
    import torch
    if isinstance(out, (tuple, list)):
        return [a for item in out for a in flatten_result(item)]
    if isinstance(out, dict):
        return [a for k in sorted(out) for a in flatten_result(out[k])]
    if isinstance(out, torch.Tensor):
        return [out.detach().cpu().numpy()]
    if isinstance(out, str):
        return [np.frombuffer(out.encode("utf-32-le"), dtype=np.uint32).copy()]
    arr = np.asarray(out)
    if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
        raise TypeError(f"returned a {type(out).__name__}; expected tensors, numbers or strings")
    return [arr]
