"""Chapter 05's explorers: each shows the chapter's own quantities (every attention of an encoder-decoder
Transformer, head by head; the hypotheses beam search holds at each step, with their log-probabilities),
every state has the first state's shape, and the figures are small."""
import inspect
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from attncourse import dates, explore
from attncourse.layers import score_table
from attncourse_ref import transformer as ref


def menu_states(spec):
    return [(b["label"], b["args"]) for b in spec["layout"]["updatemenus"][0]["buttons"]]


def slider_states(spec):
    return [(s["label"], s["args"]) for s in spec["layout"]["sliders"][0]["steps"]]


# ---------------------------------------------------------------------------------------------------
# attention: the encoder's, the decoder's and the cross-attention's weights, head by head

SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


def attention_maps(encoder, decoder, text, out):
    """What the notebook's cell does: every attention's per-head weights, read by hooks that call the module again."""
    b = dates.encode_batch([(text, out)])
    maps, calls, handles = {}, {}, []

    def keep(key):
        def hook(module, args, kwargs, output):
            call = SIGNATURE.bind(module, *args, **kwargs).arguments
            calls[key] = (module, dict(call))
            call.update(need_weights=True, average_attn_weights=False)
            maps[key] = nn.MultiheadAttention.forward(**call)[1][0]
        return hook

    for block, layer in enumerate(encoder.layers):
        handles.append(layer.self_attn.register_forward_hook(keep(("encoder", block)), with_kwargs=True))
    for block, layer in enumerate(decoder.layers):
        handles.append(layer.self_attn.register_forward_hook(keep(("decoder", block)), with_kwargs=True))
        handles.append(layer.multihead_attn.register_forward_hook(keep(("cross", block)), with_kwargs=True))
    with torch.no_grad():
        decoder(b.tgt_in, encoder(b.src, b.src_mask), b.src_mask)
    for h in handles:
        h.remove()
    return maps, calls


def by_hand(module, call):
    """softmax(q k^T / sqrt(d_head)) per head from the module's fused projection and the call's masks."""
    d = module.embed_dim
    h = module.num_heads
    w, bias = module.in_proj_weight, module.in_proj_bias
    q = call["query"][0] @ w[:d].T + bias[:d]
    k = call["key"][0] @ w[d:2 * d].T + bias[d:2 * d]
    q, k = q.view(-1, h, d // h).transpose(0, 1), k.view(-1, h, d // h).transpose(0, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d // h)
    if call.get("attn_mask") is not None:
        s = s.masked_fill(call["attn_mask"], float("-inf"))         # PyTorch: True = blocked
    if call.get("key_padding_mask") is not None:
        s = s.masked_fill(call["key_padding_mask"][0][None, None, :], float("-inf"))
    return torch.softmax(s, -1)


def test_attention_shows_every_attention_head_by_head():
    torch.manual_seed(0)
    V = len(dates.VOCAB)
    encoder = ref.Encoder(V, 16, 2, 2, 32, dropout=0.0).eval()
    decoder = ref.Decoder(V, 16, 2, 2, 32, dropout=0.0).eval()
    text, out = "May 3, 2026", "2026-05-03"
    maps, calls = attention_maps(encoder, decoder, text, out)
    spec = explore.attention(text, out, maps).spec("en")
    shown = menu_states(spec)
    order = [("encoder", 0), ("encoder", 1), ("decoder", 0), ("decoder", 1), ("cross", 0), ("cross", 1)]
    assert len(shown) == len(order) * 3                             # 2 heads and their mean, per attention
    first_shapes = None
    with torch.no_grad():
        for i, key in enumerate(order):
            expected = by_hand(*calls[key])
            for h in range(3):
                label, (data, layout) = shown[3 * i + h]
                z = np.array(data["z"][0])
                want = expected[h] if h < 2 else expected.mean(0)
                assert label == (f"{explore.KINDS[key[0]]}, block {key[1]}, "
                                 + (f"head {h}" if h < 2 else "mean of the 2 heads"))
                assert z.shape == tuple(want.shape) and np.allclose(z, want.numpy(), atol=1e-4), label
                assert len(data["x"][0]) == z.shape[1] and len(data["y"][0]) == z.shape[0]
                assert layout["yaxis.type"] == layout["xaxis.type"] == "category"
                first_shapes = first_shapes or {k: np.shape(v) for k, v in data.items() if k != "z"}
                assert {k: np.shape(v) for k, v in data.items() if k != "z"} == first_shapes
    # the decoder's self-attention is causal; the rows are the positions, named by what they write
    label, (data, _) = shown[6]
    z = np.array(data["z"][0])
    assert z.shape == (len(out) + 1, len(out) + 1) and np.all(z[np.triu_indices(len(out) + 1, 1)] == 0)
    assert [t.replace("\u200b", "") for t in data["y"][0]] == list(out) + ["<eos>"]
    assert [t.replace("\u200b", "") for t in data["x"][0]] == ["<bos>"] + list(out)
    # labels: a space is visible, and repeated characters stay distinct categories
    src = menu_states(spec)[0][1][0]["x"][0]
    assert [t.replace("\u200b", "") for t in src] == [("␣" if c == " " else c) for c in text]
    assert len(set(src)) == len(src)
    assert len(json.dumps(spec)) < 250_000


def test_attention_of_the_longest_date_is_small_enough():
    """The longest source of the dates task (28 characters), the chapter's model: 2 blocks of 4 heads each."""
    g = torch.Generator().manual_seed(0)
    source, out = "wednesday, 30 september 2026", "2026-09-30"
    S, T = len(source), len(out) + 1
    shapes = {"encoder": (4, S, S), "decoder": (4, T, T), "cross": (4, T, S)}
    maps = {(kind, block): torch.softmax(torch.randn(*shape, generator=g), -1)
            for kind, shape in shapes.items() for block in range(2)}
    e = explore.attention(source, out, maps)
    assert len(menu_states(e.spec("en"))) == 30
    assert len(json.dumps(e.spec("en"))) < 250_000


def test_attention_rejects_maps_that_do_not_fit_the_text():
    with pytest.raises(ValueError, match="cross block 0"):
        explore.attention("May 3", "2026-05-03", {("cross", 0): torch.rand(2, 11, 9)})


# ---------------------------------------------------------------------------------------------------
# beam: the hypotheses the beam holds before each step, with their log P

LETTERS = "_^$abcde"                                                # pad, bos, eos, then 5 letters


def test_beam_shows_the_hypotheses_and_their_log_probabilities():
    g = torch.Generator().manual_seed(3)
    T, V, width = 5, len(LETTERS), 3
    table = torch.randn(T, V, V, generator=g, dtype=torch.float64) * 2
    table[:, :, 0] = -1e9                                            # never pad, never bos
    table[:, :, 1] = -1e9
    table[:-1, :, 2] -= 4                                            # eos unlikely before the last step, not impossible
    decode = score_table(table)
    recorded = []

    def recording_decode(tgt_in, memory, memory_mask):
        logits = decode(tgt_in, memory, memory_mask)
        log_p = logits.log_softmax(-1)[:, :-1].gather(-1, tgt_in[:, 1:, None]).sum((1, 2))
        recorded.append([("".join(LETTERS[t] for t in row[1:]), lp.item()) for row, lp in zip(tgt_in.tolist(), log_p)])
        return logits

    memory = torch.zeros(1, T, V, dtype=torch.float64)
    tokens, score = ref.beam_search(recording_decode, memory, None, 1, 2, T, width)
    answer = "".join(LETTERS[t] for t in tokens[0].tolist() if t > 2)
    assert len(recorded) == T and max(len(hyps) for hyps in recorded) == width and answer
    target = recorded[-1][-1][0]                                     # a hypothesis the beam ranks last at the end
    spec = explore.beam("a date", target, recorded, answer).spec("en")
    shown = slider_states(spec)
    assert [label for label, _ in shown] == [str(t) for t in range(len(recorded))]
    probs = torch.softmax(table, -1).numpy()
    for (label, (data, layout)), hyps in zip(shown, recorded):
        points = {}
        for trace, green in ((0, False), (1, True)):
            for y, x, p in zip(data["y"][trace], data["x"][trace], data["customdata"][trace]):
                points[y] = (x, p, green)
        assert len(data["x"]) == len(data["y"]) == len(data["customdata"]) == 2
        assert len(points) == len({text for text, _ in hyps}) <= width
        for text, _ in hyps:
            # log P by hand: the product of the table's softmax probabilities along the prefix
            prev, log_p = 1, 0.0
            for pos, ch in enumerate(text):
                tok = LETTERS.index(ch)
                log_p += math.log(probs[pos, prev, tok])
                prev = tok
            x, p, green = points[text or "<bos>"]
            assert x == pytest.approx(log_p, abs=1e-4) and p == pytest.approx(math.exp(log_p), abs=1e-4)
            assert green == target.startswith(text)
        # ranked best first, top to bottom
        order = layout["yaxis.categoryarray"]
        assert [points[t][0] for t in order] == sorted((points[t][0] for t in order), reverse=True)
        assert layout["yaxis.type"] == "category" and layout["yaxis.autorange"] == "reversed"
    assert spec["layout"]["title"]["text"] == f"Beam search of width {width} on 'a date'<br>answer {answer}, correct {target}"
    assert len(json.dumps(spec)) < 250_000


def test_beam_shows_a_hypothesis_handed_over_twice_once():
    steps = [[("", 0.0), ("", 0.0), ("", 0.0)], [("2", -0.1), ("1", -3.0), ("2", -0.1)]]
    spec = explore.beam("x", "21", steps, "21").spec("en")
    first, second = (args for _, args in slider_states(spec))
    assert first[0]["y"] == [[], ["<bos>"]] and first[0]["x"] == [[], [0.0]]
    assert second[0]["y"] == [["1"], ["2"]] and second[1]["yaxis.categoryarray"] == ["2", "1"]
