"""Visible checks for chapter 05: the Transformer.

The blocks are compared with torch.nn.TransformerEncoderLayer / TransformerDecoderLayer holding
the same weights; everything else with stored cases (tools/make_check_data.py).
"""
import torch
from torch import nn

from ..forbid import ELEMENTARY
from ..layers import prefix_decoder, score_table
from ._core import (build_module, call, close, expect_tensor, fail, forbidding, load_cases, max_error, ok,
                    require_callable, same, tensor)

# LayerNorm is written from scratch: none of PyTorch's normalisation layers may do it (the hidden
# tests forbid the same list).
LAYER_NORM_BUILTINS = ("torch.nn.functional.layer_norm", "torch.layer_norm", "torch.native_layer_norm",
                       "torch.nn.LayerNorm", "torch.nn.functional.group_norm", "torch.group_norm",
                       "torch.nn.functional.instance_norm", "torch.instance_norm",
                       "torch.nn.functional.batch_norm", "torch.batch_norm",
                       "aten::layer_norm", "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm",
                       "aten::instance_norm", "aten::batch_norm", "aten::native_batch_norm",
                       "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training")
# The blocks and stacks are built from their parts, not from PyTorch's finished layers.
TRANSFORMER_BUILTINS = ("torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer",
                        "torch.nn.TransformerEncoder", "torch.nn.TransformerDecoder", "torch.nn.Transformer",
                        "aten::_transformer_encoder_layer_fwd")
# Label smoothing is written from scratch, from log-probabilities: F.log_softmax (or logsumexp) may be used,
# PyTorch's cross-entropy and negative log-likelihood losses may not, with or without label_smoothing or
# ignore_index (the hidden tests forbid the same list). F.cross_entropy itself is refused at the dispatcher, by
# the nll_loss_forward it runs: its Python name is not listed, because the grader's source scan reads every
# solution cell, and sequence_loss's may call F.cross_entropy.
LABEL_SMOOTHING_BUILTINS = ("torch.nn.CrossEntropyLoss", "torch.nn.functional.nll_loss", "torch.nn.NLLLoss",
                            "aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward",
                            "aten::nll_loss2d", "aten::nll_loss2d_forward")
# Both are elementary computations besides (attncourse.forbid.ELEMENTARY): F.rms_norm of the centred input, or
# F.cross_entropy with probability targets, fail by construction.
LAYER_NORM_ALLOWED = ELEMENTARY
LABEL_SMOOTHING_ALLOWED = ELEMENTARY | {"aten::log_softmax", "aten::_log_softmax", "aten::logsumexp",
                                        "aten::softmax", "aten::_softmax"}


def _data():
    return load_cases("ch05")


# ---- LayerNorm ------------------------------------------------------------------------------------------------
def _fresh_layer_norm(cls):
    module = call(cls, 5, what="LayerNorm(5)")
    if not isinstance(module, nn.Module):
        fail("LayerNorm(5) should build a torch.nn.Module")
    shapes = {k: list(v.shape) for k, v in module.state_dict().items()}
    if shapes != {"weight": [5], "bias": [5]}:
        fail(f"LayerNorm(5) should hold exactly weight [5] and bias [5] (torch.nn.LayerNorm's names); yours: {shapes}")
    if not all(isinstance(getattr(module, n, None), nn.Parameter) for n in ("weight", "bias")):
        fail("weight and bias must be nn.Parameter, or the optimiser never trains them")
    if not (bool((module.weight == 1).all()) and bool((module.bias == 0).all())):
        fail("a fresh LayerNorm should start with weight = ones and bias = zeros, so that at first it only normalises")


def check_layer_norm(cls):
    """Check LayerNorm(normalized_shape, eps=1e-5): forward in float64 and float32, against stored cases."""
    require_callable(cls, "LayerNorm", kind="class")
    c = _data()["layer_norm"]
    with forbidding(LAYER_NORM_BUILTINS, "LayerNorm", LAYER_NORM_ALLOWED):
        _fresh_layer_norm(cls)
        module = build_module(cls, c["init"], "LayerNorm", c["state"])
        x = tensor(c["x"])
        y = expect_tensor(call(module, x, what="LayerNorm.forward(x)"), "LayerNorm output", shape=(2, 3, 5),
                          dtype=torch.float64).detach()
        if not close(y, tensor(c["output"]), 1e-9):
            for key, message in [
                    ("unbiased", "your variance is unbiased (divides by D - 1); LayerNorm divides by D: "
                                 "x.var(dim=-1, unbiased=False), or the mean of (x - mean)^2"),
                    ("eps_outside", "eps goes inside the square root: (x - mean) / sqrt(var + eps), "
                                    "not (x - mean) / (sqrt(var) + eps)"),
                    ("wrong_axis", "you normalised over the tokens (dim -2); LayerNorm normalises each token over "
                                   "its own D features: the last dimension (dim=-1, keepdim=True)"),
                    ("no_affine", "you normalised but forgot the learned scale and shift: multiply by weight, "
                                  "then add bias"),
                    ("swapped_affine", "weight and bias are swapped: y = z * weight + bias")]:
                if close(y, tensor(c[key]), 1e-9):
                    fail(message)
            fail(f"LayerNorm differs from the expected output (max error {max_error(y, tensor(c['output'])):.3g}): "
                 "mean and biased variance over the last dimension, then (x - mean) / sqrt(var + eps) * weight + bias")
        ok("float64: mean and biased variance over the last dimension, eps inside the root, weight and bias")
        y32 = expect_tensor(call(module.float(), x.float(), what="LayerNorm on float32 input"),
                            "LayerNorm output for float32 input", shape=(2, 3, 5))
        if y32.dtype != torch.float32:
            fail(f"float32 input gave {y32.dtype} output: keep the input's dtype")
        fresh = call(cls, 6, what="LayerNorm(6)").float()
        big = call(fresh, tensor(c["offset_x"]).float(), what="LayerNorm on float32 inputs near 100").detach()
        err = max_error(big, tensor(c["offset_output"]))
        if not err <= 2e-3:
            fail(f"float32 inputs near 100 with a spread of 0.05 give an error of {err:.3g}: computing the variance "
                 "as mean(x^2) - mean(x)^2 subtracts two nearly equal numbers and loses every significant digit. "
                 "Use the mean of (x - mean)^2")
    ok("float32: same dtype out, and precise when the mean is large")


def check_layer_norm_grad(cls):
    """Check that gradients flow through LayerNorm (to the input and to weight and bias)."""
    require_callable(cls, "LayerNorm", kind="class")
    c = _data()["layer_norm"]
    with forbidding(LAYER_NORM_BUILTINS, "LayerNorm", LAYER_NORM_ALLOWED):
        module = build_module(cls, c["init"], "LayerNorm", c["state"])
        x = tensor(c["x"]).requires_grad_()
        y = call(module, x, what="LayerNorm.forward(x)")
    if not (isinstance(y, torch.Tensor) and y.requires_grad):
        fail("the output is cut off from autograd (.detach(), .item(), .numpy() or torch.no_grad()): "
             "the hidden tests backpropagate through your LayerNorm")
    weighted = (y * tensor(c["cotangent"])).sum()
    g, gw = torch.autograd.grad(weighted, [x, module.weight], allow_unused=True)
    if gw is None:
        fail("weight receives no gradient: use self.weight (an nn.Parameter) in forward")
    if g is None:
        fail("the input receives no gradient")
    if close(g, tensor(c["grad"]), 1e-9):
        ok("gradients match torch.nn.LayerNorm's, through the mean and the variance")
        return
    if close(g, tensor(c["detached_grad"]), 1e-9):
        fail("the gradient ignores how the mean and the variance depend on x: you detached them (.detach(), "
             ".item() or torch.no_grad()). Let autograd see the whole computation")
    fail(f"the gradient with respect to x differs from the expected one (max error "
         f"{max_error(g, tensor(c['grad'])):.3g})")


# ---- FeedForward ----------------------------------------------------------------------------------------------
def check_feed_forward(cls):
    """Check FeedForward(d_model, d_ff, activation, dropout).forward(x) for both activations."""
    c = _data()["feed_forward"]
    x = tensor(c["x"])
    for activation in ("relu", "gelu"):
        init = {"d_model": 4, "d_ff": 6, "activation": activation, "dropout": 0.1}
        module = build_module(cls, init, "FeedForward", c["state"])
        y = expect_tensor(call(module, x, what=f"FeedForward(activation={activation!r}).forward(x)"),
                          "FeedForward output", shape=(2, 3, 4), dtype=torch.float64).detach()
        if close(y, tensor(c[activation])):
            continue
        if close(y, tensor(c["no_activation"])):
            fail("there is no nonlinearity between the two linear layers (two linear maps in a row are one "
                 "linear map): apply the activation to linear1's output")
        if activation == "gelu" and close(y, tensor(c["relu"])):
            fail("activation='gelu' still uses ReLU: pick F.gelu or F.relu according to self.activation")
        if activation == "gelu" and close(y, tensor(c["gelu_tanh"])):
            fail("you used the tanh approximation of GELU; PyTorch's Transformer layers use the exact one, "
                 "F.gelu(x) (approximate='none')")
        fail(f"FeedForward(activation={activation!r}) differs from linear2(activation(linear1(x))) "
             f"(max error {max_error(y, tensor(c[activation])):.3g})")
    init = {"d_model": 4, "d_ff": 6, "activation": "relu", "dropout": 0.5}
    module = build_module(cls, init, "FeedForward", c["state"]).train()
    with torch.random.fork_rng():
        torch.manual_seed(9)
        y = call(module, x, what="FeedForward(dropout=0.5) in training mode").detach()
    if not close(y, tensor(c["train"])):
        if close(y, tensor(c["relu"])):
            fail("in training mode your FeedForward gives its evaluation output: dropout is never applied. Apply "
                 "self.dropout (an nn.Dropout: active in training mode only) between the activation and linear2")
        fail("in training mode (dropout 0.5, torch.manual_seed(9) first) your FeedForward differs from "
             "linear2(dropout(activation(linear1(x)))): apply self.dropout once, to the activation's output")
    ok("FeedForward: linear2(dropout(activation(linear1(x)))) with ReLU and with GELU, in eval and training mode")


# ---- encoder and decoder blocks ------------------------------------------------------------------------------
def _torch_layer(kind, norm_first):
    """torch's own layer with fixed random weights (norms and biases drawn at random too), float64, eval."""
    cls = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    with torch.random.fork_rng():
        torch.manual_seed(5)
        layer = cls(8, 2, 12, 0.1, "relu", batch_first=True, norm_first=norm_first, dtype=torch.float64)
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if "norm" in name or name.endswith("bias"):
                    p.add_(torch.randn_like(p) * 0.3)
    return layer.eval()


def _flipped(layer, kind):
    other = _torch_layer(kind, not layer.norm_first)
    other.load_state_dict(layer.state_dict())
    return other


def _run_torch(layer, *args, **kwargs):
    # Autograd on: PyTorch's exact path rather than its inference fast path (same maths, other rounding).
    with torch.enable_grad():
        return layer(*args, **kwargs).detach()


def _block_inputs():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    memory = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    enc_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    mem_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    return x, memory, enc_mask, mem_mask


def _cross_attention_inputs(module, args, kwargs):
    """Pre-hook on the decoder block's cross-attention: x has 5 positions, memory 7."""
    names = ["query", "key", "value"]
    given = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
    query, key = given.get("query"), given.get("key")
    if query is not None and query.shape[-2] == 7:
        fail("your cross-attention takes its queries from the encoder output (memory). Queries come from the "
             "decoder, keys and values from memory: multihead_attn(x, memory, memory)")
    if key is not None and key.shape[-2] == 5:
        fail("your cross-attention takes its keys and values from the decoder itself; they come from the "
             "encoder output: multihead_attn(x, memory, memory)")


def _check_block(cls, kind, norm_first):
    name = "EncoderBlock" if kind == "encoder" else "DecoderBlock"
    theirs = _torch_layer(kind, norm_first)
    init = {"d_model": 8, "n_heads": 2, "d_ff": 12, "dropout": 0.1, "activation": "relu", "norm_first": norm_first}
    x, memory, enc_mask, mem_mask = _block_inputs()
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    with forbidding(TRANSFORMER_BUILTINS, name):
        mine = build_module(cls, init, name, {k: v.tolist() for k, v in theirs.state_dict().items()})
        if kind == "decoder":
            mine.multihead_attn.register_forward_pre_hook(_cross_attention_inputs, with_kwargs=True)
        if kind == "encoder":
            y = call(mine, x, key_mask=enc_mask, what=f"{name}.forward(x, key_mask)")
            y_plain = call(mine, x, what=f"{name}.forward(x)")
        else:
            y = call(mine, x, memory, memory_mask=mem_mask, what=f"{name}.forward(x, memory, memory_mask)")
            y_plain = call(mine, x, memory, what=f"{name}.forward(x, memory)")
    expect_tensor(y, f"{name} output", shape=(2, 5, 8), dtype=torch.float64)
    y, y_plain = y.detach(), y_plain.detach()

    def run(layer, masked=True, causal_mask=True, inverted=False):
        pad = (enc_mask if kind == "encoder" else mem_mask) if inverted else ~(enc_mask if kind == "encoder" else mem_mask)
        if kind == "encoder":
            return _run_torch(layer, x, src_key_padding_mask=pad if masked else None)
        return _run_torch(layer, x, memory, tgt_mask=causal if causal_mask else None,
                          memory_key_padding_mask=pad if masked else None)

    expected = run(theirs)
    placement = "pre-norm (norm_first=True)" if norm_first else "post-norm (norm_first=False)"
    if close(y, expected) and close(y_plain, run(theirs, masked=False)):
        _check_block_training(cls, kind, name, init, theirs, run)
        ok(f"{name}, {placement}: matches torch.nn.Transformer{kind.title()}Layer with the same weights, "
           "with and without padding, in eval and training mode")
        return
    if close(y, run(_flipped(theirs, kind))):
        right = "x = x + sublayer(norm(x)) (pre-norm)" if norm_first else "x = norm(x + sublayer(x)) (post-norm)"
        fail(f"post-norm and pre-norm are swapped: with norm_first={norm_first} the block must be {right}")
    inverted_message = ("your padding mask is inverted: nn.MultiheadAttention's key_padding_mask is True at PADDING, "
                        "ours is True at real tokens, so pass ~mask")
    if bool(torch.isnan(y).any()):
        fail(f"NaN in the output: a query found no key to attend to. {inverted_message}")
    if close(torch.nan_to_num(y), torch.nan_to_num(run(theirs, inverted=True))):
        fail(inverted_message)
    if kind == "decoder" and close(y, run(theirs, causal_mask=False)):
        fail("the decoder's self-attention sees the future: pass attn_mask = the upper triangle (True above the "
             "diagonal, i.e. blocked) so that position t attends to positions 0..t only")
    if close(y, run(theirs, masked=False)):
        what = "key_mask" if kind == "encoder" else "memory_mask"
        fail(f"padding is attended: {what} is ignored. Pass key_padding_mask=~{what} to the attention "
             "(PyTorch's mask is True at padding)")
    fail(f"{name} ({placement}) differs from torch.nn.Transformer{kind.title()}Layer with the same weights "
         f"(max error {max_error(y, expected):.3g}): check each residual connection (x + sublayer(x), with the "
         "block's input x), which norm goes where, and that the feed-forward network comes last")


def _check_block_training(cls, kind, name, init, theirs, run):
    """In training mode, after the same torch.manual_seed, the block must draw the same dropout masks as
    PyTorch's layer: the attention's own dropout, then each nn.Dropout once, in the order of the computation."""
    layer_cls = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    torch_train = layer_cls(8, 2, 12, 0.5, "relu", batch_first=True, norm_first=init["norm_first"], dtype=torch.float64)
    torch_train.load_state_dict(theirs.state_dict())
    x, memory, enc_mask, mem_mask = _block_inputs()
    with forbidding(TRANSFORMER_BUILTINS, name):
        mine = build_module(cls, {**init, "dropout": 0.5}, name, {k: v.tolist() for k, v in theirs.state_dict().items()})
        with torch.random.fork_rng():
            torch.manual_seed(12)
            if kind == "encoder":
                y = call(mine.train(), x, key_mask=enc_mask, what=f"{name}.forward(x, key_mask) in training mode")
            else:
                y = call(mine.train(), x, memory, memory_mask=mem_mask,
                         what=f"{name}.forward(x, memory, memory_mask) in training mode")
            torch.manual_seed(12)
            expected = run(torch_train.train())
    if close(y.detach(), expected):
        return
    if close(y.detach(), run(theirs)):
        fail(f"in training mode your {name} gives its evaluation output: dropout is never applied. Apply the block's "
             "nn.Dropout layers (active in training mode only) where PyTorch does: dropout1 on the attention's output, "
             "self.dropout inside the feed-forward network, the last one on its output")
    fail(f"in training mode (dropout 0.5, the same torch.manual_seed first) your {name} differs from "
         f"torch.nn.Transformer{kind.title()}Layer: apply each nn.Dropout once, where PyTorch does (dropout1 on the "
         "attention's output, self.dropout inside the feed-forward network, the last one on its output), in that order")


def check_encoder_block(cls):
    """Check EncoderBlock with norm_first=False (post-norm) against torch.nn.TransformerEncoderLayer."""
    _check_block(cls, "encoder", False)


def check_encoder_pre_norm(cls):
    """Check EncoderBlock with norm_first=True (pre-norm) against torch.nn.TransformerEncoderLayer."""
    _check_block(cls, "encoder", True)


def check_decoder_block(cls):
    """Check DecoderBlock with norm_first=False (post-norm) against torch.nn.TransformerDecoderLayer."""
    _check_block(cls, "decoder", False)


def check_decoder_pre_norm(cls):
    """Check DecoderBlock with norm_first=True (pre-norm) against torch.nn.TransformerDecoderLayer."""
    _check_block(cls, "decoder", True)


# ---- the encoder and decoder stacks ----------------------------------------------------------------------------
def _check_stack(cls, kind):
    name = kind.title()
    for placement in ("post", "pre"):
        c = _data()[f"{kind}_{placement}"]
        inputs = c["inputs"]
        with forbidding(TRANSFORMER_BUILTINS, name):
            module = build_module(cls, c["init"], name, c["state"])
            if kind == "encoder":
                y = call(module, torch.tensor(inputs["src"]), torch.tensor(inputs["src_mask"]),
                         what="Encoder.forward(src, src_mask)")
            else:
                y = call(module, torch.tensor(inputs["tgt_in"]), tensor(inputs["memory"]),
                         memory_mask=torch.tensor(inputs["memory_mask"]), what="Decoder.forward(tgt_in, memory, memory_mask)")
        expected = tensor(c["output"])
        y = expect_tensor(y, f"{name} output", shape=tuple(expected.shape), dtype=torch.float64).detach()
        if close(y, expected):
            continue
        for key, message in [
                ("unscaled", "the token embeddings are not scaled: multiply them by sqrt(d_model) before adding "
                             "the positions"),
                ("scaled_by_d", "you multiplied the embeddings by d_model; the scale is sqrt(d_model)"),
                ("no_positions", "there is no positional information: add pos_embedding(positions 0..N-1) to the "
                                 "scaled token embeddings"),
                ("no_final_norm", "a pre-norm stack ends with one more LayerNorm (self.norm): apply it to the last "
                                  "block's output"),
                ("mask_ignored", "the memory mask does not reach the blocks: pass memory_mask to every DecoderBlock")]:
            if key in c and close(y, tensor(c[key])):
                fail(message)
        projection = ", the output projection" if kind == "decoder" else ""
        fail(f"{name} ({placement}-norm) differs from the expected output (max error {max_error(y, expected):.3g}). "
             f"If the {name}Block checks pass, check the order: embedding * sqrt(D) + positions, dropout, the "
             f"blocks, the final norm{projection}")
    if kind == "decoder":
        c = _data()["decoder_tied"]
        inputs = c["inputs"]
        with forbidding(TRANSFORMER_BUILTINS, name):
            module = build_module(cls, c["init"], name, c["state"])
            y = call(module, torch.tensor(inputs["tgt_in"]), tensor(inputs["memory"]),
                     memory_mask=torch.tensor(inputs["memory_mask"]), what="Decoder(tie_embeddings=True).forward")
        y = expect_tensor(y, "Decoder output", shape=tuple(tensor(c["output"]).shape), dtype=torch.float64).detach()
        if not close(y, tensor(c["output"])):
            if close(y, tensor(c["no_bias"])):
                fail("with tie_embeddings=True your output projection dropped its bias: only the weight is shared "
                     "with the embedding (self.out.weight = self.embedding.weight); self.out still adds self.out.bias")
            fail(f"with tie_embeddings=True the Decoder differs from the expected output (max error "
                 f"{max_error(y, tensor(c['output'])):.3g}): call self.out, whose weight is the embedding's")
    ok(f"{name}: embeddings * sqrt(D) + positions, {'encoder' if kind == 'encoder' else 'decoder'} blocks, "
       "final norm in pre-norm; post-norm and pre-norm")


def check_encoder(cls):
    """Check Encoder.forward(src, src_mask) -> memory, post-norm and pre-norm, against stored cases."""
    _check_stack(cls, "encoder")


def check_decoder(cls):
    """Check Decoder.forward(tgt_in, memory, memory_mask) -> logits, post-norm and pre-norm."""
    _check_stack(cls, "decoder")


def _scalar(stored):
    return tensor(stored).reshape(())


# ---- teacher forcing -------------------------------------------------------------------------------------------
def check_shift_right(fn):
    """Check shift_right(tgt, bos) -> the decoder's input under teacher forcing."""
    require_callable(fn, "shift_right")
    c = _data()["teacher_forcing"]
    tgt, expected = torch.tensor(c["tgt"]), torch.tensor(c["shifted"])
    original = tgt.clone()
    out = expect_tensor(call(fn, tgt, c["bos"], what=f"shift_right(tgt, bos={c['bos']})"), "shift_right(tgt, bos)")
    if not same(tgt, original):
        fail("shift_right changed tgt in place: the same target is still needed for the loss. Build a new tensor")
    if out.dtype != torch.long:
        fail(f"token ids are integers: return a long tensor, not {out.dtype}")
    if tuple(out.shape) == (2, 5):
        fail("the decoder input must have the target's length T: put bos first and drop the last token (tgt[:, :-1])")
    expect_tensor(out, "shift_right(tgt, bos)", shape=(2, 4))
    if same(out, expected):
        ok("shift_right: bos, then the target without its last token")
        return
    if same(out, tgt):
        fail("the target is not shifted: the decoder would read the very token it must predict at each position "
             "and learn to copy it. Put bos first and drop the last token")
    if same(out[:, :-1], tgt[:, 1:]):
        fail("you shifted left; the decoder input is shifted RIGHT: position t reads the target token t - 1")
    if bool((out[:, -1] == c["bos"]).all()):
        fail("bos goes first (position 0), not last")
    fail(f"shift_right should give\n{expected}\ngot\n{out}")


def check_sequence_loss(fn):
    """Check sequence_loss(logits, target, pad=0): mean cross-entropy over the real (non-pad) tokens."""
    require_callable(fn, "sequence_loss")
    c = _data()["teacher_forcing"]
    logits, target = tensor(c["logits"]).requires_grad_(), torch.tensor(c["target"])
    loss = expect_tensor(call(fn, logits, target, what="sequence_loss(logits, target)"), "the loss", shape=(),
                         dtype=torch.float64)
    if not close(loss, _scalar(c["loss"]), 1e-9):
        for key, message in [
                ("with_padding", "padding is counted in the loss: positions whose target is pad must be ignored "
                                 "(cross_entropy(..., ignore_index=pad)), and the mean taken over real tokens only"),
                ("summed", "you summed over the real tokens; take the mean, so the loss does not grow with the batch"),
                ("mean_of_means", "you averaged each sequence's mean: every real token should count equally, so "
                                  "divide the total by the number of real tokens in the whole batch")]:
            if close(loss, _scalar(c[key]), 1e-9):
                fail(message)
        fail(f"the loss is {float(loss):.6f}, expected {float(_scalar(c['loss'])):.6f}: cross-entropy of logits [B, T, V] against "
             "target [B, T] at the non-pad positions (flatten B and T, or move V to dim 1)")
    (g,) = torch.autograd.grad(loss, logits)
    if not close(g, tensor(c["loss_grad"]), 1e-9):
        fail("the loss is right but its gradient is not: compute it with differentiable torch operations")
    ok("mean cross-entropy over the real tokens, padding ignored")
    other = call(fn, tensor(c["logits"]), torch.tensor(c["pad_4_target"]), pad=4, what="sequence_loss(..., pad=4)")
    if not close(other, _scalar(c["pad_4_loss"]), 1e-9):
        fail("with pad=4 the positions whose target is 4 must be ignored: use the pad argument, not 0")
    low = call(fn, tensor(c["logits"]).float(), target, what="sequence_loss on float32 logits")
    if not (isinstance(low, torch.Tensor) and low.dtype == torch.float32):
        fail("float32 logits should give a float32 loss")
    ok("the pad argument is used; float32 in, float32 out")


# ---- label smoothing -----------------------------------------------------------------------------------------------
def check_label_smoothed_loss(fn):
    """Check label_smoothed_loss(logits, target, smoothing, pad=0): value and gradient, padding, pad id, dtypes."""
    require_callable(fn, "label_smoothed_loss")
    c = _data()["label_smoothing"]
    eps = c["smoothing"]
    target = torch.tensor(c["target"])
    with forbidding(LABEL_SMOOTHING_BUILTINS, "label_smoothed_loss", LABEL_SMOOTHING_ALLOWED):
        logits = tensor(c["logits"]).requires_grad_()
        loss = expect_tensor(call(fn, logits, target, eps, what=f"label_smoothed_loss(logits, target, {eps})"),
                             "the loss", shape=(), dtype=torch.float64)
        if not close(loss, _scalar(c["loss"]), 1e-9):
            for key, message in [
                    ("unsmoothed", f"with smoothing={eps} you returned the plain cross-entropy: the smoothing argument "
                                   "is ignored"),
                    ("v_minus_1", "you spread the smoothing over the V - 1 wrong classes (target 1 - eps, the others "
                                  "eps / (V - 1)). That is another convention; this exercise uses F.cross_entropy's "
                                  "label_smoothing: eps spread over all V classes, so the target gets 1 - eps + eps / V "
                                  "and every other class eps / V"),
                    ("no_eps_over_v", "your target class gets 1 - eps and the others eps / V, so the smoothed target "
                                      "does not sum to 1: eps is spread over all V classes, the target included, which "
                                      "gets 1 - eps + eps / V. Per token: (1 - eps) * (-log p[target]) + eps * "
                                      "mean over the V classes of (-log p)"),
                    ("with_padding", "padding is counted in the loss: positions whose target is pad must be left out of "
                                     "both terms, and the mean taken over the real tokens only"),
                    ("smoothing_on_padding", "the smoothing term is taken over every position, padding included: leave "
                                             "the padded positions out of the eps * mean(-log p) term too"),
                    ("mean_over_rows", "you divided by the number of sequences (batch rows); divide the total by the "
                                       "number of real (non-pad) tokens in the whole batch"),
                    ("summed", "you summed over the real tokens; take the mean, so the loss does not grow with the "
                               "batch")]:
                if close(loss, _scalar(c[key]), 1e-9):
                    fail(message)
            fail(f"the loss is {float(loss):.12g}, expected {float(_scalar(c['loss'])):.12g}: at each real position "
                 "(1 - eps) * (-log p[target]) + eps * mean over the V classes of (-log p), averaged over the real "
                 "tokens")
        ok(f"smoothing {eps}: (1 - eps) on the target plus eps / V on every class, padding ignored")
        if not loss.requires_grad:
            fail("the loss is cut off from autograd (.detach(), .item(), .numpy() or torch.no_grad()): it is a "
                 "training loss, and the hidden tests backpropagate through it")
        (g,) = torch.autograd.grad(loss, logits)
        if not close(g, tensor(c["grad"]), 1e-9):
            fail(f"the loss is right but its gradient is not (max error {max_error(g, tensor(c['grad'])):.3g}): "
                 "compute it with differentiable torch operations")
        zero = call(fn, tensor(c["logits"]), target, 0.0, what="label_smoothed_loss(logits, target, 0.0)")
        if not close(zero, _scalar(c["unsmoothed"]), 1e-9):
            fail("with smoothing=0.0 the loss must be the plain cross-entropy over the real tokens (sequence_loss)")
        other = call(fn, tensor(c["logits"]), torch.tensor(c["pad_4_target"]), eps, pad=4,
                     what=f"label_smoothed_loss(..., {eps}, pad=4)")
        if not close(other, _scalar(c["pad_4_loss"]), 1e-9):
            fail("with pad=4 the positions whose target is 4 must be ignored: use the pad argument, not 0")
        ok("the gradient matches; smoothing 0 is the plain cross-entropy; the pad argument is used")
        big = call(fn, tensor(c["big_logits"]).float(), target, eps, what="label_smoothed_loss on large float32 logits")
        if not (isinstance(big, torch.Tensor) and big.dtype == torch.float32):
            fail("float32 logits should give a float32 loss")
        if not bool(torch.isfinite(big)):
            fail("large float32 logits (differences of a few hundred) give an infinite or NaN loss: log(softmax(x)) "
                 "rounds small probabilities to 0 and log(0) = -inf. Use F.log_softmax, or x - logsumexp(x)")
        if not close(big.double(), _scalar(c["big_loss"]), 1e-3 * float(_scalar(c["big_loss"]))):
            fail(f"on large float32 logits the loss is {float(big):.6g}, expected {float(_scalar(c['big_loss'])):.6g}")
    ok("float32 in, float32 out, and stable on large logits")


# ---- greedy decoding -----------------------------------------------------------------------------------------------
def check_greedy_decode(fn):
    """Check greedy_decode(decode, memory, memory_mask, bos, eos, max_len, pad=0) with a fixed decoder."""
    require_callable(fn, "greedy_decode")
    c = _data()["greedy"]
    decode = prefix_decoder(tensor(c["weight"]))
    widths = []

    def spy(tgt_in, memory, memory_mask=None):
        widths.append(tgt_in.shape[-1])
        return decode(tgt_in, memory, memory_mask)

    expected = torch.tensor(c["output"])
    out = call(fn, spy, tensor(c["memory"]), torch.tensor(c["mask"]), c["bos"], c["eos"], c["max_len"],
               what="greedy_decode(decode, memory, memory_mask, bos, eos, max_len)")
    out = expect_tensor(out, "greedy_decode output")
    if out.dtype != torch.long:
        fail(f"return token ids as a long tensor, not {out.dtype}")
    if widths and max(widths) == 1:
        fail("each step you pass the decoder only the last token: a Transformer decoder keeps no state, so give it "
             "the whole prefix (bos and every token so far) and read the logits of the LAST position")
    if same(out, expected):
        never = call(fn, decode, tensor(c["memory_never"]), torch.tensor(c["mask_never"]), c["bos"], c["eos"],
                     c["max_len"], what="greedy_decode on a sequence that never produces eos")
        if not same(never, torch.tensor(c["output_never"])):
            if never.shape[-1] == c["max_len"] - 1:          # a message of its own, so that it translates whole
                fail(f"a sequence that never produces eos must stop after max_len = {c['max_len']} tokens; yours stops "
                     f"after {never.shape[-1]}, one step short: expected {c['output_never']}, got {never.tolist()}")
            fail(f"a sequence that never produces eos must stop after max_len = {c['max_len']} tokens; expected "
                 f"{c['output_never']}, got {never.tolist()}")
        ok("greedy decoding: the whole prefix each step, eos included, pad after it, stops when all are done")
        return
    width = expected.shape[1]
    if tuple(out.shape) == (3, width + 1) and same(out[:, 1:], expected):
        fail("leave bos out of the result: return the generated tokens only")
    if tuple(out.shape) == (3, c["max_len"]) and same(out[:, :width], expected):
        fail("your loop runs to max_len even after every sequence has produced eos: stop as soon as all are done")
    if tuple(out.shape) == tuple(expected.shape) and same(out[expected != 0], expected[expected != 0]):
        fail("after a sequence's eos, write pad (0) in its remaining positions")
    if out.shape[0] == 3 and out.shape[1] < width and same(out, expected[:, :out.shape[1]]):
        fail(f"you stopped after {out.shape[1]} tokens, when the first sequence produced eos: keep decoding until "
             f"every sequence has produced eos (done.all()), or max_len tokens; these rows need {width}")
    fail(f"greedy_decode should give\n{expected}\ngot\n{out}\nAt each step take the argmax of the logits at the "
         "last position of the prefix, logits[:, -1], and append it to the prefix")


# ---- beam search -----------------------------------------------------------------------------------------------------
_BEAM_MISTAKES = [
    ("no_penalty", "your search ignores alpha: a finished hypothesis Y scores log P(Y) / lp(|Y|), with GNMT's length "
                   "penalty lp(n) = ((5 + n) / 6) ** alpha, and the best score (not the best log-probability) wins"),
    ("eos_not_counted", "your length penalty leaves eos out of |Y|: |Y| counts the generated tokens, eos included "
                        "(bos not), so a hypothesis that ends with eos at step t has |Y| = t"),
    ("eos_expanded", "you kept extending hypotheses after their eos: a kept candidate that ends in eos is finished, so "
                     "set it aside with its score and never extend it again"),
    ("top_per_beam", "you kept the best beam_size tokens of each beam, then the first beam_size of those: rank the "
                     "candidates of all beams together (beam_size * V of them, flattened) and keep the best beam_size"),
    ("no_parent", "you ranked the candidates by their last token's log-probability alone: add the parent "
                  "hypothesis's log-probability, so that log P(Y) sums over all of Y's tokens"),
    ("probabilities", "you added probabilities: a hypothesis's log P(Y) is the sum of its tokens' log-probabilities "
                      "(the log of the product of their probabilities)"),
    ("first_finished", "you stopped at the first hypothesis to finish, which need not be the best: set finished "
                       "hypotheses aside and go on while an unfinished one could still beat the best finished score, "
                       "or until max_len"),
    ("raw_logits", "you added raw logits: turn each step's logits into log-probabilities with F.log_softmax before "
                   "adding them up"),
    ("mask_ignored", "your search ignores memory_mask: pass it to decode at every step, repeated for the hypotheses "
                     "as memory is"),
    ("mask_misaligned", "your hypotheses get the memory_mask of another sequence: repeat memory_mask exactly as you "
                        "repeat memory (memory_mask.repeat_interleave(k, dim=0) beside memory.repeat_interleave(k, dim=0)), "
                        "so that each hypothesis keeps its own sequence's mask"),
]


def _beam_result(out, what, batch, dtype):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} should return a pair (tokens, scores), got {type(out).__name__}")
    tokens = expect_tensor(out[0], "the tokens beam_search returns")
    scores = expect_tensor(out[1], "the scores beam_search returns", shape=(batch,))
    if tokens.dtype != torch.long:
        fail(f"return token ids as a long tensor, not {tokens.dtype}")
    if scores.dtype != dtype:
        fail(f"the scores should have the logits' dtype {dtype}, not {scores.dtype}")
    return tokens, scores.detach()


def _same_answer(tokens, scores, stored_tokens, stored_scores, atol=1e-9):
    return same(tokens, torch.tensor(stored_tokens)) and close(scores, tensor(stored_scores), atol)


# Two beam forms of other codebases, which the exercise's text sets apart, and an early stop with the wrong
# bound (see _plain_beam in the grader).
_BEAM_FORMS = {
    "keep_finished": "a finished hypothesis keeps its slot in your beam (the common vectorised form, where it "
                     "competes with its frozen log-probability): in this exercise it is set aside at once, and each "
                     "step keeps the best beam_size candidates of the unfinished hypotheses' extensions",
    "refill": "you refill the beam with the first beam_size candidates that do not end (fairseq's and Hugging Face's "
              "form, from the top 2 beam_size): in this exercise the step keeps the best beam_size candidates, those "
              "that end included, so the beam holds fewer unfinished hypotheses after one finishes",
    "stop_lp_t": "you stopped too early: the bound on what an unfinished hypothesis can still score is its "
                 "log-probability divided by lp(max_len), the largest penalty a continuation can get (log P only falls, "
                 "and dividing it by a larger lp raises the score); dividing by lp(t), its current length's, "
                 "underestimates it",
}


def check_beam_search(fn):
    """Check beam_search(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0) on a score
    table (attncourse.layers.score_table): widths 1, 2 and 3, alpha 0, 0.6 and 1, exact ties, float32."""
    require_callable(fn, "beam_search")
    c = _data()["beam"]
    decode = score_table(tensor(c["table"]))
    memory, mask = tensor(c["memory"]), torch.tensor(c["mask"])
    widths = []

    def spy(tgt_in, memory, memory_mask=None):
        widths.append(tgt_in.shape[-1])
        return decode(tgt_in, memory, memory_mask)

    for e in c["settings"]:
        beam, alpha = e["beam_size"], e["alpha"]
        what = f"beam_search(decode, memory, memory_mask, bos, eos, max_len, beam_size={beam}, alpha={alpha})"
        out = call(fn, spy, memory, mask if e["masked"] else None, c["bos"], c["eos"], c["max_len"], beam, alpha,
                   what=what)
        tokens, scores = _beam_result(out, what, 2, torch.float64)
        if widths and max(widths) == 1:
            fail("each step you pass the decoder only the last token: a Transformer decoder keeps no state, so give "
                 "it the whole prefix (bos and every token so far) of each hypothesis and read the logits of the "
                 "LAST position")
        if _same_answer(tokens, scores, e["tokens"], e["scores"]):
            continue
        for key, message in _BEAM_MISTAKES:
            m = e["mistakes"][key]
            if _same_answer(tokens, scores, m["tokens"], m["scores"]):
                fail(message)
        if beam == 1:
            fail(f"with beam_size=1 beam search is greedy decoding, which gives\n{c['greedy']}\nyours gave\n"
                 f"{tokens}\nEach step keep the single best candidate; a candidate that ends in eos is finished")
        fail(f"{what} should give the tokens\n{torch.tensor(e['tokens'])}\nwith scores {e['scores']}; yours gave\n"
             f"{tokens}\nwith scores {scores.tolist()}")
    ok("widths 1, 3 and 2, alpha 0, 0.6 and 1: the best beam_size of all candidates, finished hypotheses set aside, "
       "scores log P(Y) / lp(|Y|); width 1 is greedy decoding")
    e = c["settings"][2]
    out = call(fn, score_table(tensor(c["table"], torch.float32)), memory.float(), mask if e["masked"] else None,
               c["bos"], c["eos"], c["max_len"], e["beam_size"], e["alpha"], what="beam_search on float32 logits")
    tokens, scores = _beam_result(out, "beam_search on float32 logits", 2, torch.float32)
    if not _same_answer(tokens, scores, e["tokens"], e["scores"], 1e-4):
        fail("on float32 logits your answer differs from the float64 one; keep the logits' dtype for the "
             "log-probabilities and the scores")
    out = call(fn, score_table(tensor(c["tie_table"])), tensor(c["tie_memory"]), None, c["bos"], c["eos"],
               c["max_len"], c["tie_beam_size"], what="beam_search on a score table with exact ties")
    tokens, scores = _beam_result(out, "beam_search on a score table with exact ties", 2, torch.float64)
    if not _same_answer(tokens, scores, c["tie_tokens"], c["tie_scores"]) \
            and torch.equal(tokens, torch.as_tensor(c["tie_last_tokens"])):
        fail(f"where two finished hypotheses score exactly the same your search answers the one set aside later "
             f"(tokens\n{tokens}\ninstead of\n{torch.tensor(c['tie_tokens'])}): of equal finished scores the first one "
             "set aside wins, at one step the first in its ranking (torch.argmax returns the first of equal maxima; a "
             "comparison with >= lets a later one replace it)")
    if not _same_answer(tokens, scores, c["tie_tokens"], c["tie_scores"]):
        fail(f"where candidates tie exactly your search keeps other ones than expected (tokens\n{tokens}\ninstead "
             f"of\n{torch.tensor(c['tie_tokens'])}): rank the flattened [hypotheses, V] candidates with a stable sort "
             "(torch.sort(..., descending=True, stable=True)), so that equal ones keep the lower hypothesis index, then "
             "the lower token id")
    ok("float32 in, float32 scores out; exact ties broken by hypothesis index, then token id, and of equal finished "
       "scores the first wins")
    for e in c["planted"]:
        table = tensor(e["table"])
        out = call(fn, score_table(table), torch.zeros(1, e["max_len"], table.shape[-1], dtype=torch.float64), None,
                   e["bos"], e["eos"], e["max_len"], 2, 1.0, what="beam_search with beam_size=2 where a hypothesis finishes "
                   "at step 1")
        tokens, scores = _beam_result(out, "beam_search where a hypothesis finishes at step 1", 1, torch.float64)
        if _same_answer(tokens, scores, e["tokens"], e["scores"]):
            continue
        if _same_answer(tokens, scores, e["mistake_tokens"], e["mistake_scores"]):
            fail(_BEAM_FORMS[e["kind"]])
        fail(f"where a hypothesis finishes at step 1 (beam_size=2, alpha=1.0) your search answers\n{tokens}\ninstead of\n"
             f"{torch.tensor(e['tokens'])}: a finished hypothesis leaves the beam, and each step keeps the best "
             "beam_size candidates of the unfinished ones' extensions")
    ok("a finished hypothesis leaves the beam, and the next step keeps the best beam_size of the others' extensions")
