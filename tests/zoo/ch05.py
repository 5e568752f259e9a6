"""Known-wrong implementations for chapter 05 (see tests/zoo/__init__.py).

The blocks use the learner's LayerNorm and FeedForward, and the stacks use the blocks, so a wrong
LayerNorm or FeedForward also fails the block and stack tests that exercise it.
"""
import math

import torch
import torch.nn.functional as F

from attncourse_ref.transformer import FeedForward

from . import collector

VARIANTS, _add = collector()

BLOCKS = {"test_encoder_block", "test_encoder_pre_norm", "test_decoder_block", "test_decoder_pre_norm"}
STACKS = {"test_encoder", "test_decoder"}
LAYER_NORM = {"test_layer_norm", "test_layer_norm_grad"} | BLOCKS | STACKS
ENCODER = {"test_encoder_block", "test_encoder_pre_norm", "test_encoder"}
DECODER = {"test_decoder_block", "test_decoder_pre_norm", "test_decoder"}


# ---- LayerNorm.forward -------------------------------------------------------------------------------------
@_add("unbiased variance (divides by D - 1)", "layer_norm", LAYER_NORM, "check_layer_norm", "unbiased")
def ln_unbiased(self, x):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@_add("eps outside the square root", "layer_norm", LAYER_NORM, "check_layer_norm", "inside the square root")
def ln_eps_outside(self, x):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / (torch.sqrt(var) + self.eps) * self.weight + self.bias


@_add("no eps at all", "layer_norm", LAYER_NORM, "check_layer_norm", "sqrt(var + eps)")
def ln_no_eps(self, x):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var) * self.weight + self.bias


@_add("statistics over the wrong axis (the tokens)", "layer_norm", LAYER_NORM, "check_layer_norm", "over the tokens")
def ln_wrong_axis(self, x):
    mean = x.mean(dim=-2, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-2, keepdim=True)
    return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@_add("weight and bias swapped", "layer_norm", LAYER_NORM, "check_layer_norm", "swapped")
def ln_swapped_affine(self, x):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + self.eps) * self.bias + self.weight


@_add("variance as E[x^2] - E[x]^2 (cancellation in float32)", "layer_norm", {"test_layer_norm"},
      "check_layer_norm", "mean(x^2) - mean(x)^2")
def ln_naive_variance(self, x):
    mean = x.mean(dim=-1, keepdim=True)
    var = (x * x).mean(dim=-1, keepdim=True) - mean * mean
    return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@_add("mean and variance detached from the graph", "layer_norm", {"test_layer_norm_grad"},
      "check_layer_norm_grad", "detached")
def ln_detached(self, x):
    mean = x.mean(dim=-1, keepdim=True).detach()
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True).detach()
    return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


# ---- FeedForward.forward --------------------------------------------------------------------------------------
@_add("no activation between the linear layers", "feed_forward", {"test_feed_forward"} | BLOCKS | STACKS,
      "check_feed_forward", "no nonlinearity")
def ff_no_activation(self, x):
    return self.linear2(self.dropout(self.linear1(x)))


@_add("activation always ReLU", "feed_forward", {"test_feed_forward"} | BLOCKS, "check_feed_forward",
      "still uses ReLU")
def ff_always_relu(self, x):
    return self.linear2(self.dropout(F.relu(self.linear1(x))))


@_add("tanh approximation of GELU", "feed_forward", {"test_feed_forward"} | BLOCKS, "check_feed_forward",
      "tanh approximation")
def ff_gelu_tanh(self, x):
    h = self.linear1(x)
    h = F.gelu(h, approximate="tanh") if self.activation == "gelu" else F.relu(h)
    return self.linear2(self.dropout(h))


# ---- EncoderBlock.forward --------------------------------------------------------------------------------------
@_add("encoder: norm_first ignored (always post-norm)", "encoder_block", {"test_encoder_pre_norm", "test_encoder"},
      "check_encoder_pre_norm", "swapped")
def enc_always_post(self, x, key_mask=None):
    pad = None if key_mask is None else ~key_mask
    x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


@_add("encoder: post-norm and pre-norm swapped", "encoder_block", ENCODER, "check_encoder_block", "swapped")
def enc_swapped(self, x, key_mask=None):
    pad = None if key_mask is None else ~key_mask
    if not self.norm_first:
        h = self.norm1(x)
        x = x + self.dropout1(self.self_attn(h, h, h, key_padding_mask=pad, need_weights=False)[0])
        return x + self.dropout2(FeedForward.forward(self, self.norm2(x)))
    x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


@_add("encoder: no residual around self-attention", "encoder_block", ENCODER, "check_encoder_block", "residual")
def enc_no_residual(self, x, key_mask=None):
    pad = None if key_mask is None else ~key_mask
    if self.norm_first:
        h = self.norm1(x)
        x = self.dropout1(self.self_attn(h, h, h, key_padding_mask=pad, need_weights=False)[0])
        return x + self.dropout2(FeedForward.forward(self, self.norm2(x)))
    x = self.norm1(self.dropout1(self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


@_add("encoder pre-norm: residual added to norm(x) instead of x", "encoder_block",
      {"test_encoder_pre_norm", "test_encoder"}, "check_encoder_pre_norm", "residual")
def enc_residual_from_norm(self, x, key_mask=None):
    pad = None if key_mask is None else ~key_mask
    if self.norm_first:
        x = self.norm1(x)
        x = x + self.dropout1(self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0])
        x = self.norm2(x)
        return x + self.dropout2(FeedForward.forward(self, x))
    x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


@_add("encoder: key mask passed as PyTorch's padding mask without inverting it", "encoder_block", ENCODER,
      "check_encoder_block", "inverted")
def enc_mask_not_inverted(self, x, key_mask=None):
    def attend(h):
        return self.dropout1(self.self_attn(h, h, h, key_padding_mask=key_mask, need_weights=False)[0])
    if self.norm_first:
        x = x + attend(self.norm1(x))
        return x + self.dropout2(FeedForward.forward(self, self.norm2(x)))
    x = self.norm1(x + attend(x))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


@_add("encoder: key mask ignored", "encoder_block", ENCODER, "check_encoder_block", "padding is attended")
def enc_mask_ignored(self, x, key_mask=None):
    def attend(h):
        return self.dropout1(self.self_attn(h, h, h, need_weights=False)[0])
    if self.norm_first:
        x = x + attend(self.norm1(x))
        return x + self.dropout2(FeedForward.forward(self, self.norm2(x)))
    x = self.norm1(x + attend(x))
    return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


# ---- DecoderBlock.forward ----------------------------------------------------------------------------------------
# Each variant is self-contained: the fake class pastes its body into the notebook's cell.
@_add("decoder: causal mask missing", "decoder_block", DECODER, "check_decoder_block", "sees the future")
def dec_no_causal(self, x, memory, memory_mask=None):
    pad = None if memory_mask is None else ~memory_mask
    def self_block(h):
        return self.dropout1(self.self_attn(h, h, h, need_weights=False)[0])
    def cross_block(h):
        return self.dropout2(self.multihead_attn(h, memory, memory, key_padding_mask=pad, need_weights=False)[0])
    if self.norm_first:
        x = x + self_block(self.norm1(x))
        x = x + cross_block(self.norm2(x))
        return x + self.dropout3(FeedForward.forward(self, self.norm3(x)))
    x = self.norm1(x + self_block(x))
    x = self.norm2(x + cross_block(x))
    return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


@_add("decoder: cross-attention with Q and K/V swapped", "decoder_block", DECODER, "check_decoder_block",
      "queries from the encoder output")
def dec_cross_swapped(self, x, memory, memory_mask=None):
    n = x.shape[-2]
    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    def self_block(h):
        return self.dropout1(self.self_attn(h, h, h, attn_mask=future, need_weights=False)[0])
    def cross_block(h):
        return self.dropout2(self.multihead_attn(memory, h, h, need_weights=False)[0])
    if self.norm_first:
        x = x + self_block(self.norm1(x))
        x = x + cross_block(self.norm2(x))
        return x + self.dropout3(FeedForward.forward(self, self.norm3(x)))
    x = self.norm1(x + self_block(x))
    x = self.norm2(x + cross_block(x))
    return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


@_add("decoder: memory mask ignored", "decoder_block", DECODER, "check_decoder_block", "padding is attended")
def dec_mask_ignored(self, x, memory, memory_mask=None):
    n = x.shape[-2]
    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    def self_block(h):
        return self.dropout1(self.self_attn(h, h, h, attn_mask=future, need_weights=False)[0])
    def cross_block(h):
        return self.dropout2(self.multihead_attn(h, memory, memory, need_weights=False)[0])
    if self.norm_first:
        x = x + self_block(self.norm1(x))
        x = x + cross_block(self.norm2(x))
        return x + self.dropout3(FeedForward.forward(self, self.norm3(x)))
    x = self.norm1(x + self_block(x))
    x = self.norm2(x + cross_block(x))
    return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


@_add("decoder: norm_first ignored (always post-norm)", "decoder_block", {"test_decoder_pre_norm", "test_decoder"},
      "check_decoder_pre_norm", "swapped")
def dec_always_post(self, x, memory, memory_mask=None):
    n = x.shape[-2]
    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    pad = None if memory_mask is None else ~memory_mask
    x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, attn_mask=future, need_weights=False)[0]))
    x = self.norm2(x + self.dropout2(self.multihead_attn(x, memory, memory, key_padding_mask=pad,
                                                         need_weights=False)[0]))
    return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


@_add("decoder: no residual around cross-attention", "decoder_block", DECODER, "check_decoder_block", "residual")
def dec_no_cross_residual(self, x, memory, memory_mask=None):
    n = x.shape[-2]
    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    pad = None if memory_mask is None else ~memory_mask
    def self_block(h):
        return self.dropout1(self.self_attn(h, h, h, attn_mask=future, need_weights=False)[0])
    def cross_block(h):
        return self.dropout2(self.multihead_attn(h, memory, memory, key_padding_mask=pad, need_weights=False)[0])
    if self.norm_first:
        x = x + self_block(self.norm1(x))
        x = cross_block(self.norm2(x))
        return x + self.dropout3(FeedForward.forward(self, self.norm3(x)))
    x = self.norm1(x + self_block(x))
    x = self.norm2(cross_block(x))
    return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


# ---- Encoder.forward and Decoder.forward --------------------------------------------------------------------------
@_add("encoder: embeddings not scaled by sqrt(D)", "encoder", {"test_encoder"}, "check_encoder", "not scaled")
def encoder_unscaled(self, src, src_mask=None):
    x = self.dropout(self.embedding(src) + self.pos_embedding(torch.arange(src.shape[-1], device=src.device)))
    for layer in self.layers:
        x = layer(x, src_mask)
    return self.norm(x)


@_add("encoder: embeddings scaled by D", "encoder", {"test_encoder"}, "check_encoder", "the scale is sqrt(d_model)")
def encoder_scaled_by_d(self, src, src_mask=None):
    positions = torch.arange(src.shape[-1], device=src.device)
    x = self.dropout(self.embedding(src) * self.d_model + self.pos_embedding(positions))
    for layer in self.layers:
        x = layer(x, src_mask)
    return self.norm(x)


@_add("encoder: no positions", "encoder", {"test_encoder"}, "check_encoder", "no positional information")
def encoder_no_positions(self, src, src_mask=None):
    x = self.dropout(self.embedding(src) * math.sqrt(self.d_model))
    for layer in self.layers:
        x = layer(x, src_mask)
    return self.norm(x)


@_add("encoder: final LayerNorm of the pre-norm stack missing", "encoder", {"test_encoder"}, "check_encoder",
      "one more LayerNorm")
def encoder_no_final_norm(self, src, src_mask=None):
    positions = torch.arange(src.shape[-1], device=src.device)
    x = self.dropout(self.embedding(src) * math.sqrt(self.d_model) + self.pos_embedding(positions))
    for layer in self.layers:
        x = layer(x, src_mask)
    return x


@_add("decoder: embeddings not scaled by sqrt(D)", "decoder", {"test_decoder"}, "check_decoder", "not scaled")
def decoder_unscaled(self, tgt_in, memory, memory_mask=None):
    positions = torch.arange(tgt_in.shape[-1], device=tgt_in.device)
    x = self.dropout(self.embedding(tgt_in) + self.pos_embedding(positions))
    for layer in self.layers:
        x = layer(x, memory, memory_mask)
    return self.out(self.norm(x))


@_add("decoder: no positions", "decoder", {"test_decoder"}, "check_decoder", "no positional information")
def decoder_no_positions(self, tgt_in, memory, memory_mask=None):
    x = self.dropout(self.embedding(tgt_in) * math.sqrt(self.d_model))
    for layer in self.layers:
        x = layer(x, memory, memory_mask)
    return self.out(self.norm(x))


@_add("decoder: memory mask not passed to the blocks", "decoder", {"test_decoder"}, "check_decoder",
      "memory mask does not reach")
def decoder_mask_dropped(self, tgt_in, memory, memory_mask=None):
    positions = torch.arange(tgt_in.shape[-1], device=tgt_in.device)
    x = self.dropout(self.embedding(tgt_in) * math.sqrt(self.d_model) + self.pos_embedding(positions))
    for layer in self.layers:
        x = layer(x, memory)
    return self.out(self.norm(x))


# ---- teacher forcing -------------------------------------------------------------------------------------------------
@_add("target not shifted", "shift_right", {"test_shift_right"}, "check_shift_right", "not shifted")
def shift_none(tgt, bos):
    return tgt.clone()


@_add("target shifted left", "shift_right", {"test_shift_right"}, "check_shift_right", "shifted left")
def shift_left(tgt, bos):
    return torch.cat([tgt[:, 1:], torch.zeros_like(tgt[:, :1])], dim=1)


@_add("bos prepended without dropping the last token", "shift_right", {"test_shift_right"}, "check_shift_right",
      "target's length")
def shift_keeps_last(tgt, bos):
    return torch.cat([torch.full_like(tgt[:, :1], bos), tgt], dim=1)


@_add("padding counted in the loss", "sequence_loss", {"test_sequence_loss"}, "check_sequence_loss",
      "padding is counted")
def loss_with_padding(logits, target, pad=0):
    return F.cross_entropy(logits.flatten(0, -2), target.flatten())


@_add("loss summed over tokens", "sequence_loss", {"test_sequence_loss"}, "check_sequence_loss", "summed")
def loss_summed(logits, target, pad=0):
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=pad, reduction="sum")


@_add("mean of per-sequence means", "sequence_loss", {"test_sequence_loss"}, "check_sequence_loss",
      "each sequence's mean")
def loss_mean_of_means(logits, target, pad=0):
    per_token = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad, reduction="none")
    real = (target != pad).to(logits.dtype)
    return ((per_token * real).sum(1) / real.sum(1)).mean()


@_add("pad argument ignored (always 0)", "sequence_loss", {"test_sequence_loss"}, "check_sequence_loss",
      "pad argument")
def loss_pad_zero(logits, target, pad=0):
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=0)


# ---- label smoothing ---------------------------------------------------------------------------------------------------
@_add("label smoothing: padding counted in the mean", "label_smoothed_loss", {"test_label_smoothed_loss"},
      "check_label_smoothed_loss", "padding is counted")
def ls_with_padding(logits, target, smoothing, pad=0):
    log_p = F.log_softmax(logits, dim=-1)
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * nll + smoothing * -log_p.mean(dim=-1)).mean()


@_add("label smoothing spread over the V - 1 wrong classes (the other convention)", "label_smoothed_loss",
      {"test_label_smoothed_loss"}, "check_label_smoothed_loss", "another convention")
def ls_v_minus_1(logits, target, smoothing, pad=0):
    log_p = F.log_softmax(logits, dim=-1)
    real = target != pad
    nll = -log_p.gather(-1, target.masked_fill(~real, 0).unsqueeze(-1)).squeeze(-1)
    others = (-log_p.sum(dim=-1) - nll) / (logits.shape[-1] - 1)
    return ((1 - smoothing) * nll + smoothing * others)[real].mean()


@_add("label smoothing: the smoothing term taken over the padding too", "label_smoothed_loss",
      {"test_label_smoothed_loss"}, "check_label_smoothed_loss", "padding included")
def ls_smoothing_on_padding(logits, target, smoothing, pad=0):
    log_p = F.log_softmax(logits, dim=-1)
    real = target != pad
    nll = -log_p.gather(-1, target.masked_fill(~real, 0).unsqueeze(-1)).squeeze(-1)
    return (1 - smoothing) * nll[real].mean() + smoothing * (-log_p.mean(dim=-1)).mean()


@_add("label smoothing: target probability 1 - eps, without its share eps / V", "label_smoothed_loss",
      {"test_label_smoothed_loss"}, "check_label_smoothed_loss", "1 - eps + eps / V")
def ls_no_eps_over_v(logits, target, smoothing, pad=0):
    log_p = F.log_softmax(logits, dim=-1)
    real = target != pad
    onehot = F.one_hot(target.masked_fill(~real, 0), logits.shape[-1]).to(logits.dtype)
    q = (1 - smoothing) * onehot + (1 - onehot) * smoothing / logits.shape[-1]
    return -(q * log_p).sum(dim=-1)[real].mean()


@_add("label smoothing with log(softmax(x)) (underflows on large logits)", "label_smoothed_loss",
      {"test_label_smoothed_loss"}, "check_label_smoothed_loss", "log(softmax(x)) rounds")
def ls_log_of_softmax(logits, target, smoothing, pad=0):
    log_p = torch.log(torch.softmax(logits, dim=-1))
    real = target != pad
    nll = -log_p.gather(-1, target.masked_fill(~real, 0).unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * nll + smoothing * -log_p.mean(dim=-1))[real].mean()


@_add("label smoothing: mean over the batch rows, not the real tokens", "label_smoothed_loss",
      {"test_label_smoothed_loss"}, "check_label_smoothed_loss", "number of sequences")
def ls_mean_over_rows(logits, target, smoothing, pad=0):
    log_p = F.log_softmax(logits, dim=-1)
    real = target != pad
    nll = -log_p.gather(-1, target.masked_fill(~real, 0).unsqueeze(-1)).squeeze(-1)
    per_token = (1 - smoothing) * nll + smoothing * -log_p.mean(dim=-1)
    return per_token[real].sum() / target.shape[0]


# ---- greedy decoding ----------------------------------------------------------------------------------------------------
@_add("greedy decoding not stopping at the end token", "greedy_decode", {"test_greedy_decode"},
      "check_greedy_decode", "runs to max_len")
def greedy_no_stop(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
    return prefix[:, 1:]


@_add("greedy decoding without pad after eos", "greedy_decode", {"test_greedy_decode"}, "check_greedy_decode",
      "write pad")
def greedy_no_pad(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix[:, 1:]


@_add("greedy decoding feeding only the last token", "greedy_decode", {"test_greedy_decode"}, "check_greedy_decode",
      "only the last token")
def greedy_last_only(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix[:, -1:], memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix[:, 1:]


@_add("greedy decoding returning bos", "greedy_decode", {"test_greedy_decode"}, "check_greedy_decode",
      "leave bos out")
def greedy_keeps_bos(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix


@_add("greedy decoding reading the first position's logits", "greedy_decode", {"test_greedy_decode"},
      "check_greedy_decode", "logits[:, -1]")
def greedy_first_position(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, 0].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix[:, 1:]


# ---- issue 23: training mode (dropout), a tied head's bias, decoding that stops too early ----------------------
@_add("greedy decoding stopping when the first sequence ends", "greedy_decode", {"test_greedy_decode"},
      "check_greedy_decode", "every sequence")
def greedy_stops_at_first_eos(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.any()):
            break
    return prefix[:, 1:]


@_add("greedy decoding one step short of max_len", "greedy_decode", {"test_greedy_decode"}, "check_greedy_decode",
      "max_len")
def greedy_one_short(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    prefix = torch.full((memory.shape[0], 1), bos, dtype=torch.long)
    done = torch.zeros(memory.shape[0], dtype=torch.bool)
    for _ in range(max_len - 1):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix[:, 1:]


@_add("feed-forward network without dropout", "feed_forward", {"test_feed_forward"} | BLOCKS | STACKS,
      "check_feed_forward", "dropout is never applied")
def ff_no_dropout(self, x):
    act = F.gelu if self.activation == "gelu" else F.relu
    return self.linear2(act(self.linear1(x)))


@_add("encoder block without dropout on its sublayers' outputs", "encoder_block", ENCODER, "check_encoder_block",
      "where PyTorch does")
def enc_no_dropout(self, x, key_mask=None):
    pad = None if key_mask is None else ~key_mask
    if self.norm_first:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, key_padding_mask=pad, need_weights=False)[0]
        return x + FeedForward.forward(self, self.norm2(x))
    x = self.norm1(x + self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0])
    return self.norm2(x + FeedForward.forward(self, x))


@_add("decoder: tied output projection without its bias", "decoder", {"test_decoder"}, "check_decoder", "bias")
def decoder_tied_no_bias(self, tgt_in, memory, memory_mask=None):
    positions = torch.arange(tgt_in.shape[-1], device=tgt_in.device)
    x = self.dropout(self.embedding(tgt_in) * math.sqrt(self.d_model) + self.pos_embedding(positions))
    for layer in self.layers:
        x = layer(x, memory, memory_mask)
    h = self.norm(x)
    if self.out.weight is self.embedding.weight:
        return h @ self.embedding.weight.T          # tied: the embedding matrix transposed (its bias forgotten)
    return self.out(h)


# ---- beam search (issue 22) ------------------------------------------------------------------------------------------
@_add("beam search without the length penalty", "beam_search", {"test_beam_search"}, "check_beam_search", "ignores alpha")
def beam_no_penalty(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search whose length penalty leaves eos out of |Y|", "beam_search", {"test_beam_search"}, "check_beam_search", "eos included")
def beam_eos_not_counted(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t - (tokens[-1] == eos)) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search extending finished hypotheses past eos", "beam_search", {"test_beam_search"}, "check_beam_search", "never extend it")
def beam_eos_expanded(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if t == max_len:
                    cut = tokens[:tokens.index(eos) + 1] if eos in tokens else tokens
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, cut)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search keeping the top beam_size tokens of each beam", "beam_search", {"test_beam_search"}, "check_beam_search", "candidates of all")
def beam_top_per_beam(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                mine = [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
                candidates += sorted(mine, key=lambda c: -float(c[1]))[:beam_size]
            candidates = candidates[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search forgetting the parent's log-probability", "beam_search", {"test_beam_search"}, "check_beam_search", "parent")
def beam_no_parent(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                candidates += [(tokens + [v], lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search adding probabilities", "beam_search", {"test_beam_search"}, "check_beam_search", "log-probabilities")
def beam_probabilities(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.softmax(logits, dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search stopping at the first finished hypothesis", "beam_search", {"test_beam_search"}, "check_beam_search", "first hypothesis")
def beam_first_finished(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = F.log_softmax(logits, dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive or best is not None:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


# Each variant's body is pasted alone into a fake student's notebook: it carries its own search loop.
@_add("beam search breaking ties by token id before hypothesis", "beam_search", {"test_beam_search"}, "check_beam_search",
      "stable sort")
def beam_ties_by_token(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    rank, stop_at, form = (lambda c: (-float(c[1]), c[0][-1])), None, None          # ties by token id first
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best, held = [([], 0.0)], None, []
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=rank)
            kept = candidates[:beam_size]
            if form == "keep_finished":
                pool = sorted([(c, False) for c in candidates] + [(h, True) for h in held], key=lambda c: -float(c[0][1]))
                held = [c for c, fin in pool[:beam_size] if fin]
                kept = [c for c, fin in pool[:beam_size] if not fin]
            elif form == "refill" and t < max_len:
                kept = [c for c in kept if c[0][-1] == eos] + [c for c in candidates[:2 * beam_size] if c[0][-1] != eos][:beam_size]
            alive = []
            for tokens, logp in kept:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                    held.append((tokens, logp))
                else:
                    alive.append((tokens, logp))
            if not alive or (stop_at and best is not None and best[0] >= max(float(lp) for _, lp in alive) / stop_at(t)):
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search where the later of two equal finished hypotheses wins", "beam_search", {"test_beam_search"},
      "check_beam_search", "set aside later")
def beam_last_of_equal(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            kept = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in kept:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score >= best[0]:          # >=: a later equal one replaces the first
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            bound = None if not alive else max(float(lp) for _, lp in alive) / ((5 + max_len) / 6) ** alpha
            if not alive or (best is not None and best[0] >= bound):
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search stopping early against lp(t), not lp(max_len)", "beam_search", {"test_beam_search"},
      "check_beam_search", "lp(max_len)")
def beam_stop_lp_t(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    rank, stop_at, form = (lambda c: -float(c[1])), (lambda t: ((5 + t) / 6) ** alpha), None   # bound with lp(t)
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best, held = [([], 0.0)], None, []
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=rank)
            kept = candidates[:beam_size]
            if form == "keep_finished":
                pool = sorted([(c, False) for c in candidates] + [(h, True) for h in held], key=lambda c: -float(c[0][1]))
                held = [c for c, fin in pool[:beam_size] if fin]
                kept = [c for c, fin in pool[:beam_size] if not fin]
            elif form == "refill" and t < max_len:
                kept = [c for c in kept if c[0][-1] == eos] + [c for c in candidates[:2 * beam_size] if c[0][-1] != eos][:beam_size]
            alive = []
            for tokens, logp in kept:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                    held.append((tokens, logp))
                else:
                    alive.append((tokens, logp))
            if not alive or (stop_at and best is not None and best[0] >= max(float(lp) for _, lp in alive) / stop_at(t)):
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search where a finished hypothesis keeps its slot", "beam_search", {"test_beam_search"}, "check_beam_search",
      "keeps its slot")
def beam_keep_finished(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    rank, stop_at, form = (lambda c: -float(c[1])), None, "keep_finished"
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best, held = [([], 0.0)], None, []
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=rank)
            kept = candidates[:beam_size]
            if form == "keep_finished":
                pool = sorted([(c, False) for c in candidates] + [(h, True) for h in held], key=lambda c: -float(c[0][1]))
                held = [c for c, fin in pool[:beam_size] if fin]
                kept = [c for c, fin in pool[:beam_size] if not fin]
            elif form == "refill" and t < max_len:
                kept = [c for c in kept if c[0][-1] == eos] + [c for c in candidates[:2 * beam_size] if c[0][-1] != eos][:beam_size]
            alive = []
            for tokens, logp in kept:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                    held.append((tokens, logp))
                else:
                    alive.append((tokens, logp))
            if not alive or (stop_at and best is not None and best[0] >= max(float(lp) for _, lp in alive) / stop_at(t)):
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search refilled from the top 2 beam_size (fairseq, Hugging Face)", "beam_search", {"test_beam_search"},
      "check_beam_search", "refill the beam")
def beam_refill(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    rank, stop_at, form = (lambda c: -float(c[1])), None, "refill"
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best, held = [([], 0.0)], None, []
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=rank)
            kept = candidates[:beam_size]
            if form == "keep_finished":
                pool = sorted([(c, False) for c in candidates] + [(h, True) for h in held], key=lambda c: -float(c[0][1]))
                held = [c for c, fin in pool[:beam_size] if fin]
                kept = [c for c, fin in pool[:beam_size] if not fin]
            elif form == "refill" and t < max_len:
                kept = [c for c in kept if c[0][-1] == eos] + [c for c in candidates[:2 * beam_size] if c[0][-1] != eos][:beam_size]
            alive = []
            for tokens, logp in kept:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                    held.append((tokens, logp))
                else:
                    alive.append((tokens, logp))
            if not alive or (stop_at and best is not None and best[0] >= max(float(lp) for _, lp in alive) / stop_at(t)):
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)


@_add("beam search on raw logits", "beam_search", {"test_beam_search"}, "check_beam_search", "log_softmax")
def beam_raw_logits(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    answers, scores = [], []
    for b in range(memory.shape[0]):
        mem = memory[b:b + 1]
        mask = None if memory_mask is None else memory_mask[b:b + 1]
        alive, best = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                logits = decode(torch.tensor([[bos] + tokens]), mem, mask)[0, -1]
                lps = logits
                candidates += [(tokens + [v], logp + lps[v]) for v in range(len(lps))]
            candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]
            alive = []
            for tokens, logp in candidates:
                if tokens[-1] == eos or t == max_len:
                    score = logp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, tokens)
                else:
                    alive.append((tokens, logp))
            if not alive:
                break
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [pad] * (width - len(a)) for a in answers]), torch.stack(scores)
