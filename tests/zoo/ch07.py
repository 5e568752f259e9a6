"""Known-wrong implementations for chapter 07 (see tests/zoo/__init__.py).

A variant's body is pasted into the learner's notebook by the fake class, so it may use only
what the notebook defines: torch, F, and the learner's own earlier functions of this chapter.
"""
import torch
import torch.nn.functional as F

from attncourse_ref.vision import patchify, shifted_window_mask, window_partition, window_reverse

from . import collector

VARIANTS, _add = collector()

PATCHES = {"test_patchify", "test_patch_embedding", "test_vit"}
EMBED = {"test_patch_embedding", "test_vit"}
BLOCKS = {"test_swin_block", "test_swin_block_shifted"}
PARTITION = {"test_window_partition", "test_shifted_window_mask"} | BLOCKS
REVERSE = {"test_window_reverse"} | BLOCKS
MASK = {"test_shifted_window_mask", "test_swin_block_shifted"}
INDEX = {"test_relative_position_index", "test_window_attention", "test_window_attention_masked"} | BLOCKS
ATTENTION = {"test_window_attention", "test_window_attention_masked"} | BLOCKS
MASKED = {"test_window_attention_masked", "test_swin_block_shifted"}


# ---- patchify ------------------------------------------------------------------------------------------
@_add("patch grid numbered column by column (transposed)", "patchify", PATCHES, "check_patchify",
      "numbered column by column")
def patchify_grid_transposed(x, p):
    B, C, H, W = x.shape
    if H % p or W % p:
        raise ValueError(f"patch size {p} does not divide {H} x {W}")
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 4, 2, 3, 5, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


@_add("pixels inside a patch listed column by column", "patchify", PATCHES, "check_patchify",
      "pixels column by column")
def patchify_inner_transposed(x, p):
    B, C, H, W = x.shape
    if H % p or W % p:
        raise ValueError(f"patch size {p} does not divide {H} x {W}")
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 5, 3, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


@_add("channel-first patch vectors (the unfold order)", "patchify", PATCHES, "check_patchify", "channel first")
def patchify_unfold_order(x, p):
    B, C, H, W = x.shape
    if H % p or W % p:
        raise ValueError(f"patch size {p} does not divide {H} x {W}")
    return F.unfold(x, p, stride=p).transpose(1, 2)


@_add("reshape without permute", "patchify", PATCHES, "check_patchify", "reshape alone")
def patchify_no_permute(x, p):
    B, C, H, W = x.shape
    if H % p or W % p:
        raise ValueError(f"patch size {p} does not divide {H} x {W}")
    return x.reshape(B, (H // p) * (W // p), p * p * C)


@_add("no ValueError for a size p does not divide", "patchify", {"test_patchify"}, "check_patchify", "ValueError")
def patchify_no_check(x, p):
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


# ---- unpatchify -------------------------------------------------------------------------------------
@_add("unpatchify reads the grid column by column", "unpatchify", {"test_unpatchify"}, "check_unpatchify",
      "numbered column by column")
def unpatchify_grid_transposed(patches, p, H, W):
    B, N, D = patches.shape
    C = D // (p * p)
    return patches.reshape(B, W // p, H // p, p, p, C).permute(0, 5, 2, 3, 1, 4).reshape(B, C, H, W)


@_add("unpatchify reads channel-first vectors", "unpatchify", {"test_unpatchify"}, "check_unpatchify",
      "channel first")
def unpatchify_channels_first(patches, p, H, W):
    return F.fold(patches.transpose(1, 2), (H, W), p, stride=p)


@_add("unpatchify with a reshape alone", "unpatchify", {"test_unpatchify"}, "check_unpatchify", "reshape alone")
def unpatchify_no_permute(patches, p, H, W):
    B, N, D = patches.shape
    return patches.reshape(B, D // (p * p), H, W)


# ---- conv_to_patch_weights ----------------------------------------------------------------------------
@_add("conv weight flattened in its own (c, i, j) order", "conv_to_patch_weights", {"test_conv_to_patch_weights"},
      "check_conv_to_patch_weights", "(c, i, j)")
def conv_plain_reshape(weight):
    return weight.reshape(weight.shape[0], -1)


@_add("kernel rows and columns swapped", "conv_to_patch_weights", {"test_conv_to_patch_weights"},
      "check_conv_to_patch_weights", "rows and columns")
def conv_inner_transposed(weight):
    return weight.permute(0, 3, 2, 1).reshape(weight.shape[0], -1)


# ---- PatchEmbedding.forward ----------------------------------------------------------------------------
@_add("patch embedding on unfold's channel-first patches", "patch_embedding", EMBED, "check_patch_embedding",
      "channel first")
def embedding_unfold(self, x):
    return self.proj(F.unfold(x, self.patch_size, stride=self.patch_size).transpose(1, 2))


@_add("patch embedding returns [B, d_model, N]", "patch_embedding", EMBED, "check_patch_embedding", "[B, N, d_model]")
def embedding_transposed(self, x):
    return self.proj(patchify(x, self.patch_size)).transpose(1, 2)


# ---- ViT.forward ------------------------------------------------------------------------------------
@_add("class token added after the position embeddings", "vit", {"test_vit"}, "check_vit",
      "class token first, then add")
def vit_cls_after_pos(self, x):
    tokens = self.patch_embed(x) + self.pos_embed[:, 1:]
    tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
    return self.head(self.norm(self.encoder(tokens))[:, 0])


@_add("class token appended at the end", "vit", {"test_vit"}, "check_vit", "in front")
def vit_cls_at_end(self, x):
    tokens = self.patch_embed(x)
    tokens = torch.cat([tokens, self.cls_token.expand(tokens.shape[0], -1, -1)], dim=1) + self.pos_embed
    return self.head(self.norm(self.encoder(tokens))[:, -1])


@_add("class token missing: mean of the patch tokens", "vit", {"test_vit"}, "check_vit", "class token's final state")
def vit_mean_pool(self, x):
    tokens = self.patch_embed(x) + self.pos_embed[:, 1:]
    return self.head(self.norm(self.encoder(tokens)).mean(1))


@_add("head reads the last token", "vit", {"test_vit"}, "check_vit", "token 0")
def vit_last_token(self, x):
    tokens = self.patch_embed(x)
    tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1) + self.pos_embed
    return self.head(self.norm(self.encoder(tokens))[:, -1])


@_add("no final LayerNorm", "vit", {"test_vit"}, "check_vit", "final LayerNorm")
def vit_no_norm(self, x):
    tokens = self.patch_embed(x)
    tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1) + self.pos_embed
    return self.head(self.encoder(tokens)[:, 0])


# ---- window_partition / window_reverse ---------------------------------------------------------------
@_add("window partition with H and W swapped", "window_partition", PARTITION, "check_window_partition",
      "height and width swapped")
def partition_hw_swapped(x, M):
    B, H, W, C = x.shape
    return x.reshape(B, W // M, M, H // M, M, C).transpose(2, 3).reshape(-1, M, M, C)


@_add("window partition without the transpose", "window_partition", PARTITION, "check_window_partition",
      "strips")
def partition_no_transpose(x, M):
    return x.reshape(-1, M, M, x.shape[-1])


@_add("windows numbered column by column", "window_partition", PARTITION, "check_window_partition",
      "windows are numbered column by column")
def partition_column_order(x, M):
    B, H, W, C = x.shape
    return x.reshape(B, H // M, M, W // M, M, C).permute(0, 3, 1, 2, 4, 5).reshape(-1, M, M, C)


@_add("window reverse without the transpose", "window_reverse", REVERSE, "check_window_reverse", "strips")
def reverse_no_transpose(windows, M, H, W):
    return windows.reshape(-1, H, W, windows.shape[-1])


@_add("window reverse with H and W swapped", "window_reverse", REVERSE, "check_window_reverse",
      "height and width swapped")
def reverse_hw_swapped(windows, M, H, W):
    C = windows.shape[-1]
    return windows.reshape(-1, W // M, H // M, M, M, C).transpose(2, 3).reshape(-1, H, W, C)


# ---- shifted_window_mask -------------------------------------------------------------------------------
@_add("mask regions computed before the shift (unshifted coordinates)", "shifted_window_mask", MASK,
      "check_shifted_window_mask", "unshifted")
def mask_before_shift(H, W, M, shift):
    def band(n):   # where the image will be cut, labelled in the original image
        i = torch.arange(n)
        return (i < shift).long() * 2 + (i >= n - M + shift).long()

    region = band(H)[:, None] * 3 + band(W)[None, :]
    windows = window_partition(region[None, :, :, None], M).reshape(-1, M * M)
    return (windows[:, :, None] != windows[:, None, :]).float() * -100.0


@_add("region map shifted like the features", "shifted_window_mask", MASK, "check_shifted_window_mask",
      "shifted twice")
def mask_rolled_twice(H, W, M, shift):
    def band(n):
        i = torch.arange(n)
        return (i >= n - M).long() + (i >= n - shift).long()

    region = torch.roll(band(H)[:, None] * 3 + band(W)[None, :], (-shift, -shift), (0, 1))
    windows = window_partition(region[None, :, :, None], M).reshape(-1, M * M)
    return (windows[:, :, None] != windows[:, None, :]).float() * -100.0


@_add("mask inverted", "shifted_window_mask", MASK, "check_shifted_window_mask", "inverted")
def mask_inverted(H, W, M, shift):
    def band(n):
        i = torch.arange(n)
        return (i >= n - M).long() + (i >= n - shift).long()

    region = band(H)[:, None] * 3 + band(W)[None, :]
    windows = window_partition(region[None, :, :, None], M).reshape(-1, M * M)
    return (windows[:, :, None] == windows[:, None, :]).float() * -100.0


@_add("-inf instead of the Swin code's -100", "shifted_window_mask", {"test_shifted_window_mask"},
      "check_shifted_window_mask", "-100")
def mask_minus_inf(H, W, M, shift):
    def band(n):
        i = torch.arange(n)
        return (i >= n - M).long() + (i >= n - shift).long()

    region = band(H)[:, None] * 3 + band(W)[None, :]
    windows = window_partition(region[None, :, :, None], M).reshape(-1, M * M)
    return torch.zeros(windows.shape[0], M * M, M * M).masked_fill(windows[:, :, None] != windows[:, None, :],
                                                                     float("-inf"))


@_add("bool mask", "shifted_window_mask", MASK, "check_shifted_window_mask", "float mask")
def mask_bool(H, W, M, shift):
    def band(n):
        i = torch.arange(n)
        return (i >= n - M).long() + (i >= n - shift).long()

    region = band(H)[:, None] * 3 + band(W)[None, :]
    windows = window_partition(region[None, :, :, None], M).reshape(-1, M * M)
    return windows[:, :, None] == windows[:, None, :]


@_add("shift ignored (all-zero mask)", "shifted_window_mask", MASK, "check_shifted_window_mask", "all zeros")
def mask_zeros(H, W, M, shift):
    return torch.zeros(H * W // (M * M), M * M, M * M)


# ---- relative_position_index --------------------------------------------------------------------------
@_add("relative index without the (M - 1) offset", "relative_position_index", INDEX,
      "check_relative_position_index", "(M - 1) offset")
def index_no_offset(M):
    y, x = torch.arange(M).repeat_interleave(M), torch.arange(M).repeat(M)
    return (y[:, None] - y[None, :]) * (2 * M - 1) + (x[:, None] - x[None, :])


@_add("relative index with rows and columns swapped", "relative_position_index", INDEX,
      "check_relative_position_index", "rows and columns swapped")
def index_swapped(M):
    y, x = torch.arange(M).repeat_interleave(M), torch.arange(M).repeat(M)
    return (x[:, None] - x[None, :] + M - 1) * (2 * M - 1) + (y[:, None] - y[None, :] + M - 1)


@_add("relative index with stride 2M", "relative_position_index", INDEX, "check_relative_position_index", "2M - 1")
def index_stride_2m(M):
    y, x = torch.arange(M).repeat_interleave(M), torch.arange(M).repeat(M)
    return (y[:, None] - y[None, :] + M - 1) * (2 * M) + (x[:, None] - x[None, :] + M - 1)


@_add("relative index from key minus query", "relative_position_index", INDEX, "check_relative_position_index",
      "query minus key")
def index_key_minus_query(M):
    y, x = torch.arange(M).repeat_interleave(M), torch.arange(M).repeat(M)
    return (y[None, :] - y[:, None] + M - 1) * (2 * M - 1) + (x[None, :] - x[:, None] + M - 1)


# ---- WindowAttention.forward ---------------------------------------------------------------------------
@_add("bias table gathered but not permuted to [heads, N, N]", "window_attention", ATTENTION,
      "check_window_attention", "permute")
def attention_bias_not_permuted(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    bias = self.relative_position_bias_table[self.relative_position_index].reshape(h, N, N)
    if mask is not None:
        nW = mask.shape[0]
        bias = (bias + mask[:, None]).repeat(B_ // nW, 1, 1, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


@_add("no relative position bias", "window_attention", ATTENTION, "check_window_attention",
      "relative position bias")
def attention_no_bias(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    bias = None
    if mask is not None:
        bias = mask[:, None].repeat(B_ // mask.shape[0], 1, 1, 1).to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


@_add("scores not scaled by 1/sqrt(d_head)", "window_attention", ATTENTION, "check_window_attention", "scale")
def attention_unscaled(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    attn = q @ k.transpose(-2, -1) + self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)
    if mask is not None:
        nW = mask.shape[0]
        attn = (attn.view(B_ // nW, nW, h, N, N) + mask[None, :, None]).view(B_, h, N, N)
    out = attn.softmax(-1) @ v
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


@_add("q, k, v split as [heads, 3] instead of [3, heads]", "window_attention", ATTENTION,
      "check_window_attention", "[Q | K | V]")
def attention_wrong_split(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, h, 3, C // h).permute(3, 0, 2, 1, 4)
    bias = self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)
    if mask is not None:
        nW = mask.shape[0]
        bias = (bias + mask[:, None]).repeat(B_ // nW, 1, 1, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


@_add("window attention ignores the mask", "window_attention", MASKED, "check_window_attention_masked",
      "ignores the mask")
def attention_ignores_mask(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    bias = self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


@_add("mask repeated window by window instead of image by image", "window_attention", MASKED,
      "check_window_attention_masked", "image by image")
def attention_mask_interleaved(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    bias = self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)
    if mask is not None:
        nW = mask.shape[0]
        bias = (bias + mask[:, None]).repeat_interleave(B_ // nW, 0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
    return self.proj(out.transpose(1, 2).reshape(B_, N, C))


# ---- PatchMerging.forward ------------------------------------------------------------------------------
@_add("2 x 2 neighbours concatenated in row-major order", "patch_merging", {"test_patch_merging"},
      "check_patch_merging", "order")
def merging_row_major(self, x):
    x0, x1 = x[:, 0::2, 0::2], x[:, 0::2, 1::2]
    x2, x3 = x[:, 1::2, 0::2], x[:, 1::2, 1::2]
    return self.reduction(self.norm(torch.cat([x0, x1, x2, x3], -1)))


@_add("2 x 2 merge by a reshape alone", "patch_merging", {"test_patch_merging"}, "check_patch_merging",
      "neighbours")
def merging_reshape(self, x):
    B, H, W, C = x.shape
    return self.reduction(self.norm(x.reshape(B, H // 2, W // 2, 4 * C)))


@_add("LayerNorm after the reduction", "patch_merging", {"test_patch_merging"}, "check_patch_merging",
      "LayerNorm")
def merging_norm_after(self, x):
    x0, x1 = x[:, 0::2, 0::2], x[:, 1::2, 0::2]
    x2, x3 = x[:, 0::2, 1::2], x[:, 1::2, 1::2]
    return self.norm(self.reduction(torch.cat([x0, x1, x2, x3], -1)))


# ---- SwinBlock.forward ---------------------------------------------------------------------------------
@_add("cyclic shift in the wrong direction", "swin_block", {"test_swin_block_shifted"}, "check_swin_block_shifted",
      "wrong direction")
def block_wrong_direction(self, x):
    B, H, W, C = x.shape
    M, s = self.window_size, self.shift
    h = self.norm1(x)
    mask = None
    if s:
        h = torch.roll(h, shifts=(s, s), dims=(1, 2))
        mask = shifted_window_mask(H, W, M, s).to(x)
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C), mask).reshape(-1, M, M, C), M, H, W)
    if s:
        h = torch.roll(h, shifts=(-s, -s), dims=(1, 2))
    x = x + h
    return x + self.mlp(self.norm2(x))


@_add("cyclic shift not reversed", "swin_block", {"test_swin_block_shifted"}, "check_swin_block_shifted",
      "shift back")
def block_not_reversed(self, x):
    B, H, W, C = x.shape
    M, s = self.window_size, self.shift
    h = self.norm1(x)
    mask = None
    if s:
        h = torch.roll(h, shifts=(-s, -s), dims=(1, 2))
        mask = shifted_window_mask(H, W, M, s).to(x)
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C), mask).reshape(-1, M, M, C), M, H, W)
    x = x + h
    return x + self.mlp(self.norm2(x))


@_add("shifted block without the mask", "swin_block", {"test_swin_block_shifted"}, "check_swin_block_shifted",
      "without the mask")
def block_no_mask(self, x):
    B, H, W, C = x.shape
    M, s = self.window_size, self.shift
    h = self.norm1(x)
    if s:
        h = torch.roll(h, shifts=(-s, -s), dims=(1, 2))
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C)).reshape(-1, M, M, C), M, H, W)
    if s:
        h = torch.roll(h, shifts=(s, s), dims=(1, 2))
    x = x + h
    return x + self.mlp(self.norm2(x))


@_add("shift ignored", "swin_block", {"test_swin_block_shifted"}, "check_swin_block_shifted", "ignores the shift")
def block_no_shift(self, x):
    B, H, W, C = x.shape
    M = self.window_size
    h = self.norm1(x)
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C)).reshape(-1, M, M, C), M, H, W)
    x = x + h
    return x + self.mlp(self.norm2(x))


@_add("post-norm block (LayerNorm after the residual sum)", "swin_block", BLOCKS, "check_swin_block", "pre-norm")
def block_post_norm(self, x):
    B, H, W, C = x.shape
    M, s = self.window_size, self.shift
    h = x
    mask = None
    if s:
        h = torch.roll(h, shifts=(-s, -s), dims=(1, 2))
        mask = shifted_window_mask(H, W, M, s).to(x)
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C), mask).reshape(-1, M, M, C), M, H, W)
    if s:
        h = torch.roll(h, shifts=(s, s), dims=(1, 2))
    x = self.norm1(x + h)
    return self.norm2(x + self.mlp(x))


@_add("MLP without its residual connection", "swin_block", BLOCKS, "check_swin_block", "residual")
def block_no_mlp_residual(self, x):
    B, H, W, C = x.shape
    M, s = self.window_size, self.shift
    h = self.norm1(x)
    mask = None
    if s:
        h = torch.roll(h, shifts=(-s, -s), dims=(1, 2))
        mask = shifted_window_mask(H, W, M, s).to(x)
    h = window_reverse(self.attn(window_partition(h, M).reshape(-1, M * M, C), mask).reshape(-1, M, M, C), M, H, W)
    if s:
        h = torch.roll(h, shifts=(s, s), dims=(1, 2))
    x = x + h
    return self.mlp(self.norm2(x))


# ---- MixerBlock.forward --------------------------------------------------------------------------------
@_add("token-mixing MLP without its residual", "mixer_block", {"test_mixer_block"}, "check_mixer_block",
      "token-mixing residual")
def mixer_no_token_residual(self, x):
    x = self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
    return x + self.channel_mlp(self.norm2(x))


@_add("channel-mixing MLP without its residual", "mixer_block", {"test_mixer_block"}, "check_mixer_block",
      "channel-mixing residual")
def mixer_no_channel_residual(self, x):
    x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
    return self.channel_mlp(self.norm2(x))


@_add("LayerNorm taken over the tokens", "mixer_block", {"test_mixer_block"}, "check_mixer_block", "over channels")
def mixer_norm_over_tokens(self, x):
    x = x + self.token_mlp(F.layer_norm(x.transpose(1, 2), (x.shape[1],))).transpose(1, 2)
    return x + self.channel_mlp(self.norm2(x))


# ---- issue 23: integer results, float32 computation of float64 inputs -----------------------------------------
@_add("relative position index as floats", "relative_position_index", INDEX, "check_relative_position_index",
      "torch.long")
def index_float(M):
    y = torch.linspace(0, M - 1, M).repeat_interleave(M)
    x = torch.linspace(0, M - 1, M).repeat(M)
    dy = y[:, None] - y[None, :] + M - 1
    dx = x[:, None] - x[None, :] + M - 1
    return dy * (2 * M - 1) + dx


@_add("window attention's softmax in float32", "window_attention", ATTENTION, "check_window_attention",
      "float32's rounding")
def attention_softmax_float32(self, x, mask=None):
    B_, N, C = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    bias = self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)
    if mask is not None:
        nW = mask.shape[0]
        bias = (bias + mask[:, None]).repeat(B_ // nW, 1, 1, 1)
    scores = q @ k.transpose(-2, -1) / (C // h) ** 0.5 + bias
    weights = torch.softmax(scores.float(), dim=-1).to(x.dtype)     # "for stability": float32's rounding
    return self.proj((weights @ v).transpose(1, 2).reshape(B_, N, C))
