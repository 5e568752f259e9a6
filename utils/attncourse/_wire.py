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
