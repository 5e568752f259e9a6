"""Hidden tests for chapter 07: patches, ViT, Swin windows, masks, relative positions, Mixer.

Sizes are drawn so that H != W in most cases (a swapped height and width is only visible then),
windows come from at least two images (the mask must repeat per image, not per window), and
relative position bias tables are drawn at scale 1 (a wrong index must change the output).
"""
import numpy as np
import torch

from .. import vision as ref
from . import fixed, function_case, hidden_test, module_case, raises_case

DTYPES = [torch.float32, torch.float64]


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _int(rng, lo, hi):
    """An integer in [lo, hi]."""
    return int(rng.integers(lo, hi + 1))


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def _grid(rng):
    """(rows, columns) of a grid, different from each other."""
    gh = _int(rng, 1, 4)
    gw = _pick(rng, [g for g in range(1, 5) if g != gh])
    return gh, gw


def _randomize(module, rng, scale=1.0):
    """Weights at a scale where every parameter matters (bias tables included)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(_tensor(rng, p.shape, p.dtype, scale))
    return module


# ---- patches --------------------------------------------------------------------------------------
@hidden_test("ch07.patchify")
def patchify(rng):
    cases = []
    for i in range(10):                              # p = 1 or C = 1 would hide a wrong order: only case 0
        gh, gw = _grid(rng)
        p, c, b = _int(rng, 2, 4) if i else 1, _int(rng, 2, 4) if i else 1, _int(rng, 1, 3)
        x = _tensor(rng, (b, c, gh * p, gw * p), DTYPES[i % 2])
        cases.append(function_case(ref.patchify, [x, p], rng=rng, grad_args=(0,) if i % 4 == 0 else ()))
    for shape, p in [((1, 1, 5, 4), 2), ((2, 3, 8, 6), 4)]:
        cases.append(raises_case([torch.zeros(shape), p], exception="ValueError"))
    return cases


@hidden_test("ch07.unpatchify")
def unpatchify(rng):
    cases = []
    for i in range(10):
        gh, gw = _grid(rng)
        p, c, b = _int(rng, 2, 4) if i else 1, _int(rng, 2, 4) if i else 1, _int(rng, 1, 3)
        patches = _tensor(rng, (b, gh * gw, p * p * c), DTYPES[i % 2])
        cases.append(function_case(ref.unpatchify, [patches, p, gh * p, gw * p], rng=rng,
                                   grad_args=(0,) if i % 4 == 0 else ()))
    return cases


@hidden_test("ch07.conv_to_patch_weights")
def conv_to_patch_weights(rng):
    cases = []
    for i in range(8):
        w = _tensor(rng, (_int(rng, 1, 6), _int(rng, 2, 4), *(2 * [_int(rng, 2, 4)])), DTYPES[i % 2])
        cases.append(function_case(ref.conv_to_patch_weights, [w]))
    return cases


@hidden_test("ch07.patch_embedding")
def patch_embedding(rng):
    cases = []
    for i in range(8):
        gh, gw = _grid(rng)
        init = {"in_channels": _int(rng, 2, 3) if i else 1, "patch_size": _int(rng, 2, 4) if i else 1,
                "d_model": _int(rng, 1, 8)}
        module = ref.PatchEmbedding(**init).to(DTYPES[i % 2])
        x = _tensor(rng, (_int(rng, 1, 3), init["in_channels"], gh * init["patch_size"], gw * init["patch_size"]),
                    DTYPES[i % 2])
        cases.append(module_case(_randomize(module, rng), init, [x]))
    return cases


@hidden_test("ch07.vit")
def vit(rng):
    cases = []
    for i in range(6):
        p = _int(rng, 2, 4) if i else 1
        heads = _int(rng, 1, 3)
        init = {"image_size": p * _int(rng, 1, 3), "patch_size": p, "in_channels": _int(rng, 2, 3) if i else 1,
                "num_classes": _int(rng, 2, 5), "d_model": heads * _int(rng, 2, 4), "depth": _int(rng, 1, 2),
                "num_heads": heads, "mlp_dim": _int(rng, 4, 12), "dropout": 0.1}
        torch.manual_seed(int(rng.integers(2**31)))
        module = ref.ViT(**init).to(DTYPES[i % 2])
        with torch.no_grad():                       # a class token and positions that matter
            module.cls_token.copy_(_tensor(rng, module.cls_token.shape, module.cls_token.dtype))
            module.pos_embed.copy_(_tensor(rng, module.pos_embed.shape, module.pos_embed.dtype))
        x = _tensor(rng, (_int(rng, 1, 3), init["in_channels"], init["image_size"], init["image_size"]),
                    DTYPES[i % 2])
        cases.append(module_case(module, init, [x]))
    return cases


# ---- windows ------------------------------------------------------------------------------------------
def _feature_map(rng, M, dtype, batch=None):
    gh, gw = _grid(rng)
    b = batch or _int(rng, 1, 3)
    return _tensor(rng, (b, gh * M, gw * M, _int(rng, 1, 4)), dtype)


@hidden_test("ch07.window_partition")
def window_partition(rng):
    cases = []
    for i in range(10):
        M = _int(rng, 1, 4)
        cases.append(function_case(ref.window_partition, [_feature_map(rng, M, DTYPES[i % 2]), M], rng=rng,
                                   grad_args=(0,) if i % 4 == 0 else ()))
    return cases


@hidden_test("ch07.window_reverse")
def window_reverse(rng):
    cases = []
    for i in range(10):
        M = _int(rng, 1, 4)
        x = _feature_map(rng, M, DTYPES[i % 2])
        H, W = x.shape[1], x.shape[2]
        cases.append(function_case(ref.window_reverse, [ref.window_partition(x, M), M, H, W], rng=rng,
                                   grad_args=(0,) if i % 4 == 0 else ()))
    return cases


@hidden_test("ch07.shifted_window_mask")
def shifted_window_mask(rng):
    cases = [function_case(ref.shifted_window_mask, [8, 12, 4, 2]), function_case(ref.shifted_window_mask, [4, 8, 4, 0])]
    for _ in range(8):
        M = _int(rng, 2, 7)
        gh, gw = _grid(rng)
        cases.append(function_case(ref.shifted_window_mask, [gh * M, gw * M, M, _int(rng, 1, M - 1)]))
    return cases


@hidden_test("ch07.relative_position_index")
def relative_position_index(rng):
    return [function_case(ref.relative_position_index, [M]) for M in (1, 2, 3, 4, 7, _int(rng, 5, 9))]


def _window_attention_case(rng, dtype, masked):
    heads = _int(rng, 1, 3)
    M = _int(rng, 2, 4)
    init = {"dim": heads * _int(rng, 2, 3), "window_size": M, "num_heads": heads}
    module = _randomize(ref.WindowAttention(**init).to(dtype), rng, 0.7)
    gh, gw = _grid(rng)
    if masked:
        gw = max(gw, 2)                              # at least two windows per image, two images
        mask = ref.shifted_window_mask(gh * M, gw * M, M, _int(rng, 1, M - 1))
        x = _tensor(rng, (_int(rng, 2, 3) * gh * gw, M * M, init["dim"]), dtype)
        return module_case(module, init, [x], {"mask": mask.to(dtype)})
    x = _tensor(rng, (_int(rng, 1, 6), M * M, init["dim"]), dtype)
    return module_case(module, init, [x])


def _mostly64(i):
    """float64 in two cases of three: a float32 computation of float64 inputs fails most cases."""
    return torch.float32 if i % 3 == 1 else torch.float64


@hidden_test("ch07.window_attention")
def window_attention(rng):
    return [_window_attention_case(rng, _mostly64(i), masked=False) for i in range(8)]


@hidden_test("ch07.window_attention_masked")
def window_attention_masked(rng):
    return [_window_attention_case(rng, _mostly64(i), masked=True) for i in range(8)]


@hidden_test("ch07.patch_merging")
def patch_merging(rng):
    cases = []
    for i in range(8):
        gh, gw = _grid(rng)
        c = _int(rng, 1, 4)
        module = _randomize(ref.PatchMerging(c).to(DTYPES[i % 2]), rng)
        x = _tensor(rng, (_int(rng, 1, 3), 2 * gh, 2 * gw, c), DTYPES[i % 2])
        cases.append(module_case(module, {"dim": c}, [x]))
    return cases


def _swin_block_case(rng, dtype, shifted, batch):
    heads = _int(rng, 1, 2)
    M = _int(rng, 2, 4)
    init = {"dim": heads * _int(rng, 2, 3), "num_heads": heads, "window_size": M,   # LayerNorm(1) erases x
            "shift": _int(rng, 1, M - 1) if shifted else 0, "mlp_ratio": float(_pick(rng, [1.0, 2.0, 4.0]))}
    module = _randomize(ref.SwinBlock(**init).to(dtype), rng, 0.7)
    gh, gw = _grid(rng)
    if shifted:
        gh, gw = max(gh, 2), max(gw, 2)              # the shift only tears windows apart on a grid of 2+
        if gh == gw:
            gw += 1
    x = _tensor(rng, (batch, gh * M, gw * M, init["dim"]), dtype)
    return module_case(module, init, [x])


@hidden_test("ch07.swin_block")
def swin_block(rng):
    return [_swin_block_case(rng, DTYPES[i % 2], shifted=False, batch=1 + i % 3 // 2) for i in range(6)]


@hidden_test("ch07.swin_block_shifted")
def swin_block_shifted(rng):
    return [_swin_block_case(rng, DTYPES[i % 2], shifted=True, batch=1 + i % 3 // 2) for i in range(6)]


@hidden_test("ch07.mixer_block")
def mixer_block(rng):
    cases = []
    for i in range(8):
        n = _int(rng, 1, 6)
        init = {"num_tokens": n, "dim": _pick(rng, [d for d in range(2, 7) if d != n]),
                "token_hidden": _int(rng, 1, 6), "channel_hidden": _int(rng, 1, 6)}
        module = _randomize(ref.MixerBlock(**init).to(DTYPES[i % 2]), rng, 0.7)
        x = _tensor(rng, (_int(rng, 1, 3), n, init["dim"]), DTYPES[i % 2])
        cases.append(module_case(module, init, [x]))
    return cases


# ---- the visible checks' stored cases ----------------------------------------------------------------
# Known mistakes are computed here, on the server side, so the learner package holds their
# outputs (to name a mistake when a learner's output matches one) and never a formula.
def _patchify_variants(x, p):
    B, C, H, W = x.shape
    g = x.reshape(B, C, H // p, p, W // p, p)
    n, d = (H // p) * (W // p), p * p * C
    return {"grid_transposed": g.permute(0, 4, 2, 3, 5, 1).reshape(B, n, d),
            "inner_transposed": g.permute(0, 2, 4, 5, 3, 1).reshape(B, n, d),
            "channels_first": g.permute(0, 2, 4, 1, 3, 5).reshape(B, n, d),
            "no_permute": x.reshape(B, n, d)}


def _unpatchify_variants(patches, p, H, W):
    B, N, D = patches.shape
    C = D // (p * p)
    g = patches.reshape(B, H // p, W // p, p, p, C)
    return {"grid_transposed": patches.reshape(B, W // p, H // p, p, p, C).permute(0, 5, 2, 3, 1, 4).reshape(B, C, H, W),
            "inner_transposed": g.permute(0, 5, 1, 4, 2, 3).reshape(B, C, H, W),
            "channels_first": patches.reshape(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W),
            "no_permute": patches.reshape(B, C, H, W)}


def _mask_from_regions(region, M):
    windows = ref.window_partition(region[None, :, :, None].float(), M).reshape(-1, M * M)
    return (windows[:, :, None] != windows[:, None, :]).float() * -100.0


def _mask_variants(H, W, M, s):
    def bands(n):
        i = torch.arange(n)
        return (i >= n - M).long() + (i >= n - s).long()

    def unshifted(n):                                # the right regions, labelled in the unshifted image
        i = torch.arange(n)
        return (i < s).long() * 2 + (i >= n - M + s).long()

    shifted = bands(H)[:, None] * 3 + bands(W)[None, :]
    return {"before_shift": _mask_from_regions(unshifted(H)[:, None] * 3 + unshifted(W)[None, :], M),
            "rolled_twice": _mask_from_regions(torch.roll(shifted, (-s, -s), (0, 1)), M),
            "rolled_back": _mask_from_regions(torch.roll(shifted, (s, s), (0, 1)), M)}


def _index_variants(M):
    y, x = torch.arange(M).repeat_interleave(M), torch.arange(M).repeat(M)
    dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]
    return {"no_offset": dy * (2 * M - 1) + dx,
            "swapped": (dx + M - 1) * (2 * M - 1) + (dy + M - 1),
            "times_2m": (dy + M - 1) * (2 * M) + (dx + M - 1),
            "key_minus_query": (M - 1 - dy) * (2 * M - 1) + (M - 1 - dx)}


def _window_attention_variants(m, x, mask):
    import torch.nn.functional as F
    B_, N, C = x.shape
    h = m.num_heads
    q, k, v = m.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    table = m.relative_position_bias_table
    good = table[ref.relative_position_index(m.window_size)].permute(2, 0, 1)

    def run(bias, msk=None, interleave=False, scale=None):
        if msk is not None:
            nW = msk.shape[0]
            full = bias + msk[:, None]
            bias = full.repeat_interleave(B_ // nW, 0) if interleave else full.repeat(B_ // nW, 1, 1, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        return m.proj(out.transpose(1, 2).reshape(B_, N, C))
    q, k, v = m.qkv(x).reshape(B_, N, h, 3, C // h).permute(3, 0, 2, 1, 4)
    wrong_split = run(good)
    q, k, v = m.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    return {"wrong_split": wrong_split,
            "bias_not_permuted": run(table[ref.relative_position_index(m.window_size)].reshape(h, N, N)),
            "no_bias": run(torch.zeros_like(good)),
            "unscaled": run(good, scale=1.0),
            "mask_interleaved": run(good, mask, interleave=True),
            "mask_ignored": run(good)}


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    x = torch.arange(2 * 4 * 6, dtype=torch.float64).reshape(1, 2, 4, 6)
    patches = ref.patchify(x, 2)
    patch = {"x": x, "p": 2, "patches": patches, "variants": _patchify_variants(x, 2),
             "inverse_variants": _unpatchify_variants(patches, 2, 4, 6)}

    w = fixed((3, 2, 2, 2), 1)
    conv = {"weight": w, "linear": ref.conv_to_patch_weights(w),
            "variants": {"plain_reshape": w.reshape(3, -1), "inner_transposed": w.permute(0, 3, 2, 1).reshape(3, -1)}}

    torch.manual_seed(0)
    emb = ref.PatchEmbedding(2, 2, 3).double()
    ex = fixed((2, 2, 4, 6), 2)
    embedding = {"init": {"in_channels": 2, "patch_size": 2, "d_model": 3}, "state": dict(emb.state_dict()), "x": ex,
                 "output": emb(ex), "variants": {"channels_first": emb.proj(_patchify_variants(ex, 2)["channels_first"]),
                                                 "grid_transposed": emb.proj(_patchify_variants(ex, 2)["grid_transposed"])}}

    torch.manual_seed(1)
    vinit = {"image_size": 8, "patch_size": 4, "in_channels": 1, "num_classes": 3, "d_model": 8, "depth": 1,
             "num_heads": 2, "mlp_dim": 16}
    vit_ = ref.ViT(**vinit).double().eval()
    with torch.no_grad():
        vit_.cls_token.copy_(fixed((1, 1, 8), 3))
        vit_.pos_embed.copy_(fixed((1, 5, 8), 4))
    vx = fixed((2, 1, 8, 8), 5)
    tokens = vit_.patch_embed(vx)
    cls = vit_.cls_token.expand(2, -1, -1)
    head = lambda t, i: vit_.head(vit_.norm(vit_.encoder(t))[:, i])      # noqa: E731
    vit_variants = {
        "cls_after_pos": head(torch.cat([cls, tokens + vit_.pos_embed[:, 1:]], 1), 0),
        "cls_without_pos": head(torch.cat([cls, tokens + vit_.pos_embed[:, :-1]], 1), 0),
        "cls_at_end": head(torch.cat([tokens, cls], 1) + vit_.pos_embed, -1),
        "mean_pool": vit_.head(vit_.norm(vit_.encoder(tokens + vit_.pos_embed[:, 1:])).mean(1)),
        "last_token": head(torch.cat([cls, tokens], 1) + vit_.pos_embed, -1),
        "no_final_norm": vit_.head(vit_.encoder(torch.cat([cls, tokens], 1) + vit_.pos_embed)[:, 0])}
    vit = {"init": vinit, "state": dict(vit_.state_dict()), "x": vx, "output": vit_(vx), "variants": vit_variants}

    fx = torch.arange(2 * 4 * 6 * 2, dtype=torch.float64).reshape(2, 4, 6, 2)
    windows = ref.window_partition(fx, 2)
    g = fx.reshape(2, 2, 2, 3, 2, 2)
    window = {"x": fx, "M": 2, "windows": windows, "variants": {
        "hw_swapped": fx.reshape(2, 3, 2, 2, 2, 2).transpose(2, 3).reshape(-1, 2, 2, 2),
        "no_transpose": fx.reshape(-1, 2, 2, 2),
        "column_order": g.permute(0, 3, 1, 2, 4, 5).reshape(-1, 2, 2, 2)},
        "reverse_variants": {
        "no_transpose": windows.reshape(2, 4, 6, 2),
        "hw_swapped": windows.reshape(2, 3, 2, 2, 2, 2).transpose(2, 3).reshape(2, 4, 6, 2)}}

    configs = {"8,12,4,2": (8, 12, 4, 2), "8,8,4,2": (8, 8, 4, 2), "8,8,4,0": (8, 8, 4, 0), "12,8,4,1": (12, 8, 4, 1),
               "14,14,7,3": (14, 14, 7, 3)}
    # Stored as integers (0 and -100): a third of the size of the float text.
    mask = {"masks": {k: ref.shifted_window_mask(*c).long() for k, c in configs.items()},
            "variants": {k: v.long() for k, v in _mask_variants(8, 12, 4, 2).items()}}

    index = {"3": ref.relative_position_index(3), "2": ref.relative_position_index(2),
             "variants": _index_variants(3)}

    torch.manual_seed(2)
    wa = ref.WindowAttention(4, 2, 2).double()
    with torch.no_grad():
        wa.relative_position_bias_table.copy_(fixed((9, 2), 6))
    wx = fixed((4, 4, 4), 7)                          # 2 images x 2 windows of 2 x 2 tokens
    wmask = ref.shifted_window_mask(2, 4, 2, 1).double()
    attention = {"init": {"dim": 4, "window_size": 2, "num_heads": 2}, "state": dict(wa.state_dict()), "x": wx,
                 "mask": wmask, "output": wa(wx), "masked_output": wa(wx, wmask),
                 "variants": _window_attention_variants(wa, wx, wmask)}

    torch.manual_seed(3)
    pm = ref.PatchMerging(2).double()
    px = fixed((2, 4, 6, 2), 8)
    parts = [px[:, 0::2, 0::2], px[:, 1::2, 0::2], px[:, 0::2, 1::2], px[:, 1::2, 1::2]]
    merge = lambda order: pm.reduction(pm.norm(torch.cat([parts[i] for i in order], -1)))   # noqa: E731
    merging = {"init": {"dim": 2}, "state": dict(pm.state_dict()), "x": px, "output": pm(px),
               "variants": {"row_major": merge([0, 2, 1, 3]), "no_permute": pm.reduction(pm.norm(px.reshape(2, 2, 3, 8)))}}

    torch.manual_seed(4)
    binit = {"dim": 4, "num_heads": 2, "window_size": 2, "shift": 0, "mlp_ratio": 2.0}
    blk = _randomize(ref.SwinBlock(**binit).double(), np.random.default_rng(0), 0.5)
    sblk = ref.SwinBlock(**dict(binit, shift=1)).double()
    sblk.load_state_dict(blk.state_dict())
    bx = fixed((2, 4, 6, 4), 9)

    def branch(t):                                   # the unshifted window-attention branch
        return ref.window_reverse(blk.attn(ref.window_partition(t, 2).reshape(-1, 4, 4)).reshape(-1, 2, 2, 4), 2, 4, 6)

    post = blk.norm1(bx + branch(bx))
    block = {"init": binit, "shifted_init": dict(binit, shift=1), "state": dict(blk.state_dict()), "x": bx,
             "output": blk(bx), "shifted_output": sblk(bx), "variants": _block_variants(sblk, bx),
             "unshifted_variants": {"post_norm": blk.norm2(post + blk.mlp(post)),
                                    "no_mlp_residual": blk.mlp(blk.norm2(bx + branch(blk.norm1(bx))))}}

    torch.manual_seed(5)
    minit = {"num_tokens": 3, "dim": 4, "token_hidden": 5, "channel_hidden": 6}
    mx_ = ref.MixerBlock(**minit).double()
    mxx = fixed((2, 3, 4), 10)
    u = mx_.token_mlp(mx_.norm1(mxx).transpose(1, 2)).transpose(1, 2)
    over_tokens = mxx + mx_.token_mlp(torch.nn.functional.layer_norm(mxx.transpose(1, 2), (3,))).transpose(1, 2)
    mixer = {"init": minit, "state": dict(mx_.state_dict()), "x": mxx, "output": mx_(mxx), "variants": {
        "no_token_residual": u + mx_.channel_mlp(mx_.norm2(u)),
        "no_channel_residual": mx_.channel_mlp(mx_.norm2(mxx + u)),
        "norm_over_tokens": over_tokens + mx_.channel_mlp(mx_.norm2(over_tokens))}}
    return {"patchify": patch, "conv": conv, "patch_embedding": embedding, "vit": vit, "window": window,
            "mask": mask, "index": index, "window_attention": attention, "patch_merging": merging,
            "swin_block": block, "mixer": mixer}


def _block_variants(blk, x):
    """A shifted SwinBlock's output under the classic mistakes."""
    B, H, W, C = x.shape
    M, s = blk.window_size, blk.shift

    def run(before, after, mask):
        h = blk.norm1(x)
        h = torch.roll(h, (before, before), (1, 2)) if before else h
        win = ref.window_partition(h, M).reshape(-1, M * M, C)
        h = ref.window_reverse(blk.attn(win, mask).reshape(-1, M, M, C), M, H, W)
        h = torch.roll(h, (after, after), (1, 2)) if after else h
        y = x + h
        return y + blk.mlp(blk.norm2(y))
    mask = ref.shifted_window_mask(H, W, M, s).to(x)
    return {"wrong_direction": run(s, -s, mask), "not_reversed": run(-s, 0, mask), "no_mask": run(-s, s, None),
            "no_shift": run(0, 0, None)}
