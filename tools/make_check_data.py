"""Write the visible checks' stored cases (utils/attncourse/checks/data/<chapter>.json) from the reference.

Run after changing a reference implementation:  python tools/make_check_data.py [chapter ...]
tests/test_check_data.py fails when a stored file no longer matches what this script writes.
"""
import itertools
import json
import sys
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "utils" / "attncourse" / "checks" / "data"


def fixed(shape, seed):
    """Small, readable, reproducible inputs: normal draws rounded to two decimals."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).round() / 100


def as_list(t):
    if t.dtype == torch.bool:
        return t.tolist()
    return [round(x, 10) for x in t.flatten().tolist()] if t.dim() == 0 else _round(t.tolist())


def _round(x):
    return [_round(i) for i in x] if isinstance(x, list) else round(x, 10)


def ch02():
    from attncourse_ref import attention as ref
    q, k, v = fixed((3, 4), 1), fixed((5, 4), 2), fixed((5, 2), 3)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    out, w = ref.scaled_dot_product_attention(q, k, v)
    mout, mw = ref.scaled_dot_product_attention(q, k, v, mask)
    attention = {"q": q, "k": k, "v": v, "raw_scores": q @ k.T, "output": out, "weights": w,
                 "mask": mask, "masked_output": mout, "masked_weights": mw}

    torch.manual_seed(0)
    sa = ref.SelfAttention(4, 3).double()
    x = fixed((5, 4), 4)
    y, a = sa(x)
    orders = {}
    blocks = dict(zip("QKV", sa.qkv.weight.detach().split(3))), dict(zip("QKV", sa.qkv.bias.detach().split(3)))
    for order in itertools.permutations("QKV"):
        # A learner who splits the fused output as `order` reads block i as order[i]:
        # equivalent to the reference with the blocks rearranged accordingly.
        other = ref.SelfAttention(4, 3).double()
        placed = {name: i for i, name in enumerate(order)}
        with torch.no_grad():
            other.qkv.weight.copy_(torch.cat([blocks[0]["QKV"[placed[n]]] for n in "QKV"]))
            other.qkv.bias.copy_(torch.cat([blocks[1]["QKV"[placed[n]]] for n in "QKV"]))
        orders["".join(order)] = other(x)[0]
    self_attention = {"init": {"d_model": 4, "d_head": 3}, "state": dict(sa.state_dict()), "x": x,
                      "output": y, "weights": a, "causal_output": sa(x, ref.causal_mask(5))[0],
                      "split_orders": orders}

    torch.manual_seed(1)
    ca = ref.CrossAttention(3, 5, 2).double()
    xq, ctx = fixed((2, 3), 5), fixed((4, 5), 6)
    cy, cw = ca(xq, ctx)
    swapped = ref.CrossAttention(3, 5, 2).double()
    swapped.load_state_dict(ca.state_dict())
    with torch.no_grad():
        kw, vw = ca.kv_proj.weight.split(2)
        kb, vb = ca.kv_proj.bias.split(2)
        swapped.kv_proj.weight.copy_(torch.cat([vw, kw]))
        swapped.kv_proj.bias.copy_(torch.cat([vb, kb]))
    cross_attention = {"init": {"d_query": 3, "d_context": 5, "d_head": 2}, "state": dict(ca.state_dict()),
                       "x": xq, "context": ctx, "output": cy, "weights": cw, "kv_swapped_output": swapped(xq, ctx)[0]}
    return {"attention": attention, "causal_mask_5": ref.causal_mask(5),
            "self_attention": self_attention, "cross_attention": cross_attention}


BUILDERS = {"ch02": ch02}


def encode(obj):
    if isinstance(obj, torch.Tensor):
        return as_list(obj.detach())
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj


def build(chapter):
    with torch.no_grad():
        return json.dumps(encode(BUILDERS[chapter]()), indent=1) + "\n"


def main(chapters):
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for ch in chapters or sorted(BUILDERS):
        (DATA_DIR / f"{ch}.json").write_text(build(ch))
        print(f"wrote {DATA_DIR / f'{ch}.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
