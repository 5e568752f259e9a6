"""Visible checks for chapter 07: patches, ViT, Swin windows, masks, relative positions, Mixer.

Expected values and the outputs of known mistakes come from stored data (checks/data/ch07.json);
a learner's output that matches a known mistake gets that mistake's name and fix.
"""
import copy

import torch

from ._core import (NotDoneYet, CheckFailed, build_module, call, close, expect_tensor, fail, load_cases, max_error, ok,
                    require_callable, same, tensor)


def _data():
    return load_cases("ch07")


def _name_mistake(out, variants, messages, atol=1e-6):
    """Fail with the message of the first known mistake whose stored output ``out`` matches."""
    for key, message in messages.items():
        if key in variants:
            known = torch.as_tensor(variants[key], dtype=out.dtype if out.is_floating_point() else None)
            if close(out, known, atol):
                fail(message)


def _keeps_dtype(out, x, what):
    if out.dtype != x.dtype:
        fail(f"{what}: the input is {x.dtype} but you returned {out.dtype}; keep the input's dtype")


def _float32_agrees(module, args, expected, what, kwargs=None):
    """The same module in float32 gives float32 outputs close to the float64 ones."""
    m32 = copy.deepcopy(module).float()
    args32 = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    kw32 = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in (kwargs or {}).items()}
    out = call(m32, *args32, **kw32, what=f"{what} in float32")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        fail(f"{what} in float32 should return a float32 tensor, got "
             f"{out.dtype if isinstance(out, torch.Tensor) else type(out).__name__}")
    if not close(out, expected, atol=1e-4):
        fail(f"{what} in float32 differs from float64 by {max_error(out, expected):.3g}: avoid hard-coded float64 "
             "tensors and keep everything in the input's dtype")


# ---- patches -------------------------------------------------------------------------------------------
PATCH_MISTAKES = {
    "grid_transposed": "your patches are numbered column by column (the patch grid is transposed): number them "
                       "row by row, left to right then top to bottom, so patch n sits at grid row n // (W/p), "
                       "column n % (W/p)",
    "inner_transposed": "inside each patch you list the pixels column by column: list them row by row with a "
                        "pixel's channels together, entry (i * p + j) * C + c = pixel (i, j) of the patch, channel c",
    "channels_first": "your patch vectors put the channel first (c, i, j), the order of F.unfold and of a conv "
                      "weight; this chapter keeps a pixel's channels together: (i, j, c)",
    "no_permute": "a reshape alone cannot cut patches: it mixes rows of different patches. Reshape to "
                  "[B, C, H/p, p, W/p, p], permute the axes to (B, H/p, W/p, p, p, C), then flatten",
}


def check_patchify(fn):
    """Check patchify(x [B, C, H, W], p) -> [B, (H/p)(W/p), p*p*C]."""
    require_callable(fn, "patchify")
    c = _data()["patchify"]
    x, p = tensor(c["x"]), c["p"]
    out = call(fn, x, p, what="patchify(x [1, 2, 4, 6], p=2)")
    expect_tensor(out, "patchify(x [1, 2, 4, 6], p=2)", shape=(1, 6, 8))
    _keeps_dtype(out, x, "patchify")
    expected = tensor(c["patches"])
    if not same(out, expected):
        _name_mistake(out, c["variants"], PATCH_MISTAKES)
        fail(f"patchify differs from the expected patches (max error {max_error(out, expected):.3g}); patch 0 "
             f"should be {expected[0, 0].tolist()}, yours is {out[0, 0].tolist()}")
    x32 = x.float().requires_grad_(True)
    out32 = call(fn, x32, p, what="patchify on float32")
    _keeps_dtype(out32, x32, "patchify")
    if not out32.requires_grad:
        fail("patchify's output has no gradient: stay in torch (no .numpy(), no .detach())")
    (out32 * torch.arange(8.0)).sum().backward()
    if x32.grad is None or not close(x32.grad.reshape(-1).sort().values,
                                     torch.arange(8.0).repeat_interleave(6).reshape(-1).sort().values):
        fail("the gradient through patchify is not a rearrangement: patchify must only move values around")
    try:
        fn(torch.zeros(1, 1, 5, 4), 2)
    except ValueError:
        pass
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(f"patchify(x of size 5 x 4, p=2) raised {type(exc).__name__}; it should raise ValueError (p does not "
             "divide the height)")
    else:
        fail("patchify(x of size 5 x 4, p=2) returned; it should raise ValueError (p does not divide the height)")
    ok("patchify: raster order of patches, (i, j, c) inside each, float32 and float64, gradient, ValueError")


def check_unpatchify(fn):
    """Check unpatchify(patches [B, N, p*p*C], p, H, W) -> [B, C, H, W]."""
    require_callable(fn, "unpatchify")
    c = _data()["patchify"]
    x, patches = tensor(c["x"]), tensor(c["patches"])
    out = call(fn, patches, c["p"], 4, 6, what="unpatchify(patches [1, 6, 8], p=2, H=4, W=6)")
    expect_tensor(out, "unpatchify(patches, 2, 4, 6)", shape=(1, 2, 4, 6))
    _keeps_dtype(out, patches, "unpatchify")
    if not same(out, x):
        _name_mistake(out, c["inverse_variants"], PATCH_MISTAKES)
        fail(f"unpatchify(patchify(x)) is not x (max error {max_error(out, x):.3g}): undo patchify's steps in reverse")
    p32 = patches.float().requires_grad_(True)
    out32 = call(fn, p32, c["p"], 4, 6, what="unpatchify on float32")
    _keeps_dtype(out32, p32, "unpatchify")
    if not out32.requires_grad:
        fail("unpatchify's output has no gradient: stay in torch (no .numpy(), no .detach())")
    ok("unpatchify inverts patchify, float32 and float64, gradient")


def check_conv_to_patch_weights(fn):
    """Check conv_to_patch_weights(weight [D, C, p, p]) -> [D, p*p*C]."""
    require_callable(fn, "conv_to_patch_weights")
    c = _data()["conv"]
    w = tensor(c["weight"])
    for dtype in (torch.float64, torch.float32):
        out = call(fn, w.to(dtype), what=f"conv_to_patch_weights(weight [3, 2, 2, 2] {dtype})")
        expect_tensor(out, "conv_to_patch_weights(weight)", shape=(3, 8))
        _keeps_dtype(out, w.to(dtype), "conv_to_patch_weights")
        if not close(out, tensor(c["linear"]).to(dtype)):
            _name_mistake(out, c["variants"], {
                "plain_reshape": "you flattened the conv weight in its own (c, i, j) order; the patch vectors are "
                                 "(i, j, c): permute the weight to [D, p, p, C] before flattening",
                "inner_transposed": "the kernel's rows and columns are swapped: weight[d, c, i, j] must land in "
                                    "column (i * p + j) * C + c"})
            fail("conv_to_patch_weights differs from the expected matrix: column (i * p + j) * C + c of row d "
                 "holds weight[d, c, i, j]")
    ok("conv_to_patch_weights: the kernel read in patch-vector order")


def check_patch_embedding(cls):
    """Check PatchEmbedding(in_channels, patch_size, d_model): forward(x [B, C, H, W]) -> [B, N, d_model]."""
    c = _data()["patch_embedding"]
    module = build_module(cls, c["init"], "PatchEmbedding", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="PatchEmbedding.forward(x [2, 2, 4, 6])")
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (2, 3, 6):
        fail("PatchEmbedding returns [B, d_model, N] = [2, 3, 6]; tokens are rows: return [B, N, d_model] = [2, 6, 3] "
             "(like a convolution's output after .flatten(2).transpose(1, 2))")
    expect_tensor(out, "PatchEmbedding output [B, N, d_model]", shape=(2, 6, 3))
    if not close(out, tensor(c["output"])):
        _name_mistake(out, c["variants"], {
            "channels_first": "your PatchEmbedding flattens patches channel first (F.unfold's order); project your "
                              "patchify's (i, j, c) vectors",
            "grid_transposed": "your patches are numbered column by column: use your patchify (raster order)"})
        fail(f"PatchEmbedding output differs from the expected one (max error "
             f"{max_error(out, tensor(c['output'])):.3g}): project patchify(x, patch_size) with self.proj")
    _float32_agrees(module, [x], tensor(c["output"]), "PatchEmbedding")
    ok("PatchEmbedding: parameter names, [B, N, d_model], float32 and float64")


VIT_MISTAKES = {
    "cls_after_pos": "the class token missed its position embedding: you added pos_embed to the patches and then put "
                     "the class token in front. Concatenate the class token first, then add pos_embed to all N + 1 "
                     "tokens (row 0 is the class token's)",
    "cls_without_pos": "the class token missed its position embedding. Concatenate the class token first, then add "
                       "pos_embed to all N + 1 tokens (row 0 is the class token's)",
    "cls_at_end": "the class token goes in front (token 0), not at the end of the sequence",
    "mean_pool": "you averaged the patch tokens; this ViT has a class token and the head reads the class token's "
                 "final state (token 0 after the final LayerNorm)",
    "last_token": "the head must read token 0 (the class token), not the last token",
    "no_final_norm": "the class token's final state goes through the final LayerNorm (self.norm) before the head",
}


def check_vit(cls):
    """Check ViT(...): forward(images [B, C, H, W]) -> logits [B, num_classes]."""
    c = _data()["vit"]
    module = build_module(cls, c["init"], "ViT", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="ViT.forward(images [2, 1, 8, 8])")
    expect_tensor(out, "ViT logits [B, num_classes]", shape=(2, 3))
    expected = tensor(c["output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], VIT_MISTAKES)
        fail(f"ViT logits differ from the expected ones (max error {max_error(out, expected):.3g}): patch_embed, class "
             "token in front, + pos_embed, encoder, norm, head on token 0")
    _float32_agrees(module, [x], expected, "ViT")
    ok("ViT: parameter names, class token in front with its position, final norm, head on the class token")


# ---- windows --------------------------------------------------------------------------------------------
WINDOW_MISTAKES = {
    "hw_swapped": "you split the map with height and width swapped ([B, W/M, M, H/M, M, C]); the input is "
                  "[B, H, W, C]: reshape to [B, H/M, M, W/M, M, C]",
    "no_transpose": "your windows are strips of the image, not M x M squares: after reshaping to "
                    "[B, H/M, M, W/M, M, C], swap the two middle axes before flattening",
    "column_order": "your windows are numbered column by column; number them row by row within each image, images "
                    "one after another (the Swin code's order)",
}


def check_window_partition(fn):
    """Check window_partition(x [B, H, W, C], M) -> [B * H/M * W/M, M, M, C]."""
    require_callable(fn, "window_partition")
    c = _data()["window"]
    x = tensor(c["x"])
    for dtype in (torch.float64, torch.float32):
        out = call(fn, x.to(dtype), c["M"], what=f"window_partition(x [2, 4, 6, 2] {dtype}, M=2)")
        expect_tensor(out, "window_partition(x [2, 4, 6, 2], M=2)", shape=(12, 2, 2, 2))
        _keeps_dtype(out, x.to(dtype), "window_partition")
        if not same(out, tensor(c["windows"]).to(dtype)):
            _name_mistake(out, c["variants"], WINDOW_MISTAKES)
            fail("window_partition differs from the expected windows: window k of image b covers rows "
                 "M*(k // (W/M)) ... and columns M*(k % (W/M)) ...")
    ok("window_partition: M x M squares, row by row, image by image (H != W checked)")


def check_window_reverse(fn):
    """Check window_reverse(windows, M, H, W) -> [B, H, W, C]."""
    require_callable(fn, "window_reverse")
    c = _data()["window"]
    windows = tensor(c["windows"])
    for dtype in (torch.float64, torch.float32):
        out = call(fn, windows.to(dtype), c["M"], 4, 6, what=f"window_reverse(windows [12, 2, 2, 2] {dtype}, 2, 4, 6)")
        expect_tensor(out, "window_reverse(windows, M=2, H=4, W=6)", shape=(2, 4, 6, 2))
        _keeps_dtype(out, windows.to(dtype), "window_reverse")
        if not same(out, tensor(c["x"]).to(dtype)):
            _name_mistake(out, c["reverse_variants"], WINDOW_MISTAKES)
            fail("window_reverse(window_partition(x)) is not x: undo window_partition's steps in reverse")
    ok("window_reverse inverts window_partition (H != W checked)")


MASK_MISTAKES = {
    "before_shift": "your regions are computed on the unshifted image. The mask is for the windows of the shifted "
                    "grid: label the regions where they are after the cyclic shift (the last M rows and columns, split "
                    "at the last `shift`)",
    "rolled_twice": "you rolled the region map like the features, so it is shifted twice: the regions are already "
                    "defined on the shifted grid, partition them as they are",
    "rolled_back": "you rolled the region map back by +shift: the regions are already defined on the shifted grid",
}


def check_shifted_window_mask(fn):
    """Check shifted_window_mask(H, W, M, shift) -> float32 [nW, M*M, M*M] of 0 and -100."""
    require_callable(fn, "shifted_window_mask")
    c = _data()["mask"]
    m = call(fn, 8, 12, 4, 2, what="shifted_window_mask(8, 12, 4, 2)")
    expect_tensor(m, "shifted_window_mask(8, 12, 4, 2)", shape=(6, 16, 16))
    if m.dtype == torch.bool:
        fail("return a float mask (0 = may attend, -100 = may not) that is added to the scores, not a bool one")
    if m.dtype != torch.float32:
        fail(f"return a float32 mask, got {m.dtype}")
    if torch.isinf(m).any():
        fail("use -100 for 'may not attend', as the Swin code does, not -inf")
    expected = tensor(c["masks"]["8,12,4,2"], torch.float32)
    if not same(m, expected):
        if same(m, torch.zeros_like(m)):
            fail("your mask is all zeros: with shift > 0 the windows at the bottom and right hold tokens from "
                 "opposite sides of the image, which must not attend to each other")
        if same(m, -100.0 - expected):
            fail("your mask is inverted: 0 must mark pairs from the same region (may attend), -100 pairs from "
                 "different regions")
        _name_mistake(m, c["variants"], MASK_MISTAKES)
        bad = int((m != expected).any(-1).any(-1).nonzero()[0])
        fail(f"shifted_window_mask(8, 12, 4, 2) differs from the expected mask, first in window {bad}: draw yours "
             "with checks.compare_window_masks(shifted_window_mask, 8, 12, 4, 2)")
    for key in ("8,8,4,0", "12,8,4,1"):
        H, W, M, s = (int(v) for v in key.split(","))
        got = call(fn, H, W, M, s, what=f"shifted_window_mask({key.replace(',', ', ')})")
        if not (isinstance(got, torch.Tensor) and same(got, tensor(c["masks"][key], torch.float32))):
            if s == 0:
                fail(f"shifted_window_mask({key.replace(',', ', ')}) is wrong (with shift 0 nothing is torn apart: "
                     "all zeros)")
            fail(f"shifted_window_mask({key.replace(',', ', ')}) is wrong")
    ok("shifted_window_mask: the Swin regions after the cyclic shift, 0 / -100, float32")


def compare_window_masks(fn, H=8, W=8, M=4, shift=2):
    """Draw your shifted_window_mask(H, W, M, shift) above the expected one.

    Stored configurations: (8, 8, 4, 2), (8, 12, 4, 2), (12, 8, 4, 1), (8, 8, 4, 0), (14, 14, 7, 3).
    """
    import matplotlib.pyplot as plt

    from ..images import draw_window_masks
    key = f"{H},{W},{M},{shift}"
    stored = _data()["mask"]["masks"]
    if key not in stored:
        known = ", ".join(f"({k.replace(',', ', ')})" for k in stored)
        raise ValueError(f"no stored mask for (H, W, M, shift) = ({H}, {W}, {M}, {shift}); stored: {known}")
    expected = tensor(stored[key], torch.float32)
    try:
        mine = fn(H, W, M, shift)
    except NotImplementedError:
        fail("shifted_window_mask is not implemented yet", NotDoneYet)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), gridspec_kw={"width_ratios": [1, 1.6]})
    for row, (name, m) in enumerate([("yours", mine), ("expected", expected)]):
        draw_window_masks(torch.as_tensor(m).float(), H, W, M, axes=axes[row], title=name)
    fig.tight_layout()
    return fig


def check_relative_position_index(fn):
    """Check relative_position_index(M) -> long [M*M, M*M] with entries in [0, (2M-1)^2)."""
    require_callable(fn, "relative_position_index")
    c = _data()["index"]
    idx = call(fn, 3, what="relative_position_index(3)")
    expect_tensor(idx, "relative_position_index(3)", shape=(9, 9))
    if idx.dtype != torch.int64:
        fail(f"return an integer tensor (torch.long): it indexes the bias table; got {idx.dtype}")
    if not same(idx, torch.tensor(c["3"])):
        _name_mistake(idx, c["variants"], {
            "no_offset": "you forgot the (M - 1) offset: dy and dx run from -(M - 1) to M - 1, add M - 1 to each "
                         "so the index starts at 0 (yours has negative entries)",
            "swapped": "rows and columns swapped: the row offset is the major one, "
                       "(dy + M - 1) * (2M - 1) + (dx + M - 1)",
            "times_2m": "the table has 2M - 1 columns (dx runs over 2M - 1 values): multiply by 2M - 1, not 2M",
            "key_minus_query": "use the position of the query minus key, (dy, dx) = (y_i - y_j, x_i - x_j) with i the "
                               "query (row) and j the key (column)",
        })
        fail(f"relative_position_index(3) differs from the expected index; row 0 should be {c['3'][0]}")
    if not same(call(fn, 2, what="relative_position_index(2)"), torch.tensor(c["2"])):
        fail("relative_position_index(2) is wrong (3 was right): does your code hard-code the window size?")
    ok("relative_position_index: (dy + M - 1) * (2M - 1) + (dx + M - 1), tokens row by row")


def check_window_attention(cls):
    """Check WindowAttention(dim, window_size, num_heads): forward(x [B_, N, C]) -> [B_, N, C] (no mask)."""
    c = _data()["window_attention"]
    module = build_module(cls, c["init"], "WindowAttention", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="WindowAttention.forward(x [4, 4, 4])")
    expect_tensor(out, "WindowAttention output", shape=(4, 4, 4))
    expected = tensor(c["output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], {
            "wrong_split": "split the fused qkv output as [Q | K | V], each then cut into heads: reshape to "
                           "[B_, N, 3, heads, d_head] and move the 3 to the front",
            "bias_not_permuted": "the gathered bias is [N, N, heads]: permute it to [heads, N, N] (a reshape "
                                 "scrambles it)",
            "no_bias": "you did not add the relative position bias table[index] (as [heads, N, N]) to the scores",
            "unscaled": "scale the scores by 1/sqrt(d_head) (F.scaled_dot_product_attention does it for you)",
        })
        fail(f"WindowAttention output differs from the expected one (max error {max_error(out, expected):.3g})")
    _float64_throughout(out, expected)
    _float32_agrees(module, [x], expected, "WindowAttention")
    ok("WindowAttention: heads, relative position bias, float32 and float64")


def _float64_throughout(out, expected):
    """float64 inputs must give float64's answer, not float32's rounding of it (about 1e-8 here; the stored
    answer is rounded to 1e-10)."""
    if not close(out, expected, atol=1e-9):
        fail(f"float64 inputs gave an output off by {max_error(out, expected):.0e}, float32's rounding: part of the "
             "computation (the softmax?) ran in float32; keep the input's dtype throughout")


def check_window_attention_masked(cls):
    """Check WindowAttention.forward(x, mask [nW, N, N]) on 2 images of 2 windows each."""
    c = _data()["window_attention"]
    module = build_module(cls, c["init"], "WindowAttention", c["state"])
    x, mask = tensor(c["x"]), tensor(c["mask"])
    out = call(module, x, mask, what="WindowAttention.forward(x [4, 4, 4], mask [2, 4, 4])")
    expect_tensor(out, "WindowAttention output", shape=(4, 4, 4))
    expected = tensor(c["masked_output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], {
            "mask_ignored": "WindowAttention ignores the mask: add it to the scores (with the bias)",
            "mask_interleaved": "the batch holds image 0's windows, then image 1's: repeat the [nW, N, N] mask image "
                                "by image (mask.repeat), not window by window (repeat_interleave)"})
        fail(f"masked WindowAttention differs from the expected output (max error {max_error(out, expected):.3g})")
    _float64_throughout(out, expected)
    _float32_agrees(module, [x], expected, "masked WindowAttention", {"mask": mask})
    ok("WindowAttention with a shifted-window mask, repeated per image")


def check_patch_merging(cls):
    """Check PatchMerging(dim): forward(x [B, H, W, C]) -> [B, H/2, W/2, 2C]."""
    c = _data()["patch_merging"]
    module = build_module(cls, c["init"], "PatchMerging", c["state"])
    x = tensor(c["x"])
    try:
        out = module(x)
    except NotImplementedError:
        fail("PatchMerging.forward is not implemented yet: replace `raise NotImplementedError()` with your code", NotDoneYet)
    except Exception as exc:
        fail(f"PatchMerging.forward raised {type(exc).__name__}: {exc}. The LayerNorm acts on the 4C concatenation, "
             "before the 4C -> 2C reduction")
    expect_tensor(out, "PatchMerging output", shape=(2, 2, 3, 4))
    expected = tensor(c["output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], {
            "row_major": "wrong concatenation order: the Swin code's order is x0 = x[:, 0::2, 0::2], "
                         "x1 = x[:, 1::2, 0::2], x2 = x[:, 0::2, 1::2], x3 = x[:, 1::2, 1::2]",
            "no_permute": "a reshape alone does not gather 2 x 2 neighbours: it joins 4 tokens of the same row"})
        fail(f"PatchMerging differs from the expected output (max error {max_error(out, expected):.3g}): "
             "cat([x0, x1, x2, x3]), then LayerNorm, then the reduction")
    _float32_agrees(module, [x], expected, "PatchMerging")
    ok("PatchMerging: x0, x1, x2, x3 order, LayerNorm, 4C -> 2C")


def check_swin_block(cls):
    """Check SwinBlock(dim, num_heads, window_size, shift=0, mlp_ratio): forward(x [B, H, W, C])."""
    c = _data()["swin_block"]
    module = build_module(cls, c["init"], "SwinBlock", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="SwinBlock(shift=0).forward(x [2, 4, 6, 4])")
    expect_tensor(out, "SwinBlock output", shape=(2, 4, 6, 4))
    expected = tensor(c["output"])
    if not close(out, expected):
        _name_mistake(out, c["unshifted_variants"], {
            "post_norm": "your block normalises after the residual sum (post-norm); Swin is pre-norm: "
                         "x = x + attention(norm1(x)), then x = x + mlp(norm2(x))",
            "no_mlp_residual": "the MLP needs its residual connection: x = x + mlp(norm2(x))"})
        fail(f"SwinBlock (shift 0) differs from the expected output (max error {max_error(out, expected):.3g}): "
             "norm1, window_partition, attention, window_reverse, residual; then norm2, MLP, residual")
    _float32_agrees(module, [x], expected, "SwinBlock")
    ok("SwinBlock without shift: pre-norm window attention and MLP")


def check_swin_block_shifted(cls):
    """Check SwinBlock(..., shift=1) on a 4 x 6 map with 2 x 2 windows."""
    c = _data()["swin_block"]
    module = build_module(cls, c["shifted_init"], "SwinBlock", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="SwinBlock(shift=1).forward(x [2, 4, 6, 4])")
    expect_tensor(out, "SwinBlock output", shape=(2, 4, 6, 4))
    expected = tensor(c["shifted_output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], {
            "wrong_direction": "you rolled in the wrong direction: torch.roll(h, shifts=(-s, -s), dims=(1, 2)) before "
                               "the windows (the direction the mask assumes), (s, s) after",
            "not_reversed": "you did not shift back: after window_reverse, roll by (+s, +s) so every token returns "
                            "to its place",
            "no_mask": "the shifted block ran without the mask: tokens from opposite sides of the image attended to "
                       "each other",
            "no_shift": "your block ignores the shift: with shift > 0, roll, attend with the mask, roll back"})
        fail(f"shifted SwinBlock differs from the expected output (max error {max_error(out, expected):.3g})")
    _float32_agrees(module, [x], expected, "shifted SwinBlock")
    ok("SwinBlock with shift: roll by -s, masked window attention, roll back by +s")


def check_mixer_block(cls):
    """Check MixerBlock(num_tokens, dim, token_hidden, channel_hidden): forward(x [B, N, D])."""
    c = _data()["mixer"]
    module = build_module(cls, c["init"], "MixerBlock", c["state"])
    x = tensor(c["x"])
    out = call(module, x, what="MixerBlock.forward(x [2, 3, 4])")
    expect_tensor(out, "MixerBlock output", shape=(2, 3, 4))
    expected = tensor(c["output"])
    if not close(out, expected):
        _name_mistake(out, c["variants"], {
            "no_token_residual": "the token-mixing residual is missing: x = x + (token-mixing MLP over the token "
                                 "axis of norm1(x))",
            "no_channel_residual": "the channel-mixing residual is missing: x = x + channel_mlp(norm2(x))",
            "norm_over_tokens": "norm1 normalises each token over channels, on [B, N, D], before you transpose "
                                "for the token-mixing MLP"})
        fail(f"MixerBlock differs from the expected output (max error {max_error(out, expected):.3g}): "
             "x + token MLP over the token axis of norm1(x), then x + channel MLP of norm2(x)")
    _float32_agrees(module, [x], expected, "MixerBlock")
    ok("MixerBlock: token mixing across N, channel mixing across D, two residuals")


__all__ = [name for name in globals() if name.startswith(("check_", "compare_"))] + ["CheckFailed"]
