"""Chapter 06's explorers show the chapter's own quantities: a GPT's attention weights, the next-token
distributions of next_token_probs, and speculative decoding's min(p, q) and max(0, p - q)."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attncourse import explore
from attncourse_ref import llm
from explore_helpers import controls

TEXT = "To be, or not to be:\nthat"
VOCAB = llm.char_vocab(TEXT)


def small_gpt(seed=0):
    torch.manual_seed(seed)
    model = llm.GPT(vocab_size=len(VOCAB) + 1, block_size=32, n_layer=2, n_head=4, n_embd=16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)    # sharper weights than the initialisation's near-uniform ones
    return model


def manual_attention(model, idx):
    """[n_layer, n_head, T, T]: the forward pass written out, each block's softmax weights kept."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    maps = []
    for block in model.h:
        h = block.ln_1(x)
        C, H = h.shape[-1], block.attn.n_head
        q, k, v = block.attn.c_attn(h).split(C, dim=-1)
        q, k, v = (t.view(1, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // H)
        a = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)
        maps.append(a[0])
        x = x + block.attn.c_proj((a @ v).transpose(1, 2).reshape(1, T, C))
        x = x + block.mlp(block.ln_2(x))
    return torch.stack(maps)


def idx_of(text):
    return torch.tensor([llm.char_encode(text, VOCAB)])


def spec_size(e):
    return len(json.dumps(e.spec("en")))


class NoFusedAttention(llm.CausalSelfAttention):
    """A correct attention layer that computes its softmax itself, without F.scaled_dot_product_attention."""

    def forward(self, x, past_kv=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        a = (q @ k.transpose(-2, -1) / math.sqrt(C // self.n_head))
        a = a.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)
        return self.c_proj((a @ v).transpose(1, 2).reshape(B, T, C)), (k, v)


@torch.no_grad()
def test_attention_weights_are_the_models():
    model, idx = small_gpt(), idx_of(TEXT)
    expected = manual_attention(model, idx)
    fused = F.scaled_dot_product_attention
    model.train()
    found = explore.gpt_attention_weights(model, idx)
    assert found.shape == (2, 4, len(TEXT), len(TEXT))
    torch.testing.assert_close(found, expected.double(), atol=1e-6, rtol=0)
    assert model.training                                    # the mode it had
    assert F.scaled_dot_product_attention is fused           # PyTorch's function is back in place
    model.eval()
    # A layer that computes attention without F.scaled_dot_product_attention: nothing to watch; the explorer says so
    # (recomputing the weights itself would spell out the exercise's answer in the learner package).
    for block in model.h:
        fresh = NoFusedAttention(16, 4)
        fresh.load_state_dict(block.attn.state_dict())
        block.attn = fresh
    assert explore.gpt_attention_weights(model, idx) is None


@torch.no_grad()
def test_attention_explorer_shows_every_head_and_the_mean():
    model, idx = small_gpt(1), idx_of(TEXT)
    w = explore.gpt_attention_weights(model, idx)
    e = explore.gpt_attention(TEXT, w)
    spec = e.spec("en")
    buttons = spec["layout"]["updatemenus"][0]["buttons"]
    expected = [(f"layer {l + 1}, head {h + 1}", w[l, h]) for l in range(2) for h in range(4)]
    expected += [(f"layer {l + 1}, mean of the heads", w[l].mean(0)) for l in range(2)]
    assert sorted(b["label"] for b in buttons) == sorted(label for label, _ in expected)
    by_label = {b["label"]: b for b in buttons}
    T = len(TEXT)
    for label, want in expected:
        b = by_label[label]
        assert b["method"] == "restyle"
        z = np.array(b["args"][0]["z"][0], dtype=float)
        assert z.shape == (T, T)
        np.testing.assert_allclose(z, want.numpy(), atol=1e-4)
        assert np.all(np.triu(z, 1) == 0)                                   # the causal mask
        np.testing.assert_allclose(z.sum(-1), 1, atol=1e-3)
    heat = spec["data"][0]
    np.testing.assert_allclose(np.array(heat["z"], dtype=float), w[0, 0].numpy(), atol=1e-4)
    assert spec["layout"]["xaxis"]["ticktext"] == [{" ": "␣", "\n": "⏎"}.get(c, c) for c in TEXT]
    assert heat["customdata"][3][0] == ["b", "T"]                           # query 3 is "b", key 0 is "T"
    assert spec_size(e) < 250_000


def test_sampling_explorer_shows_next_token_probs():
    torch.manual_seed(0)
    V = 40
    logits = torch.randn(V, dtype=torch.float64) * 2
    labels = [chr(ord("a") + i) if i < 26 else str(i) for i in range(V)]
    temperatures, ks, ps = [0.5, 1.0, 2.0], [1, 3, 5, 40], [0.3, 0.6, 0.9]
    by_t = [llm.next_token_probs(logits, temperature=t) for t in temperatures]
    by_k = [llm.next_token_probs(logits, top_k=k) for k in ks]
    by_p = [llm.next_token_probs(logits, top_p=p) for p in ps]
    base = llm.next_token_probs(logits)
    e = explore.sampling(labels, base, temperatures, by_t, ks, by_k, ps, by_p, shown=12)
    spec = e.spec("en")
    order = base.argsort(descending=True)[:12]
    shown = [labels[i] for i in order]
    data = spec["data"]
    assert len(data) == 6
    for n in range(3):
        assert data[2 * n]["x"] == shown and data[2 * n + 1]["x"] == shown
        np.testing.assert_allclose(data[2 * n]["y"], base[order].numpy(), atol=1e-4)
    sliders = spec["layout"]["sliders"]
    assert len(sliders) == 3
    for n, (values, rows) in enumerate([(temperatures, by_t), (ks, by_k), (ps, by_p)]):
        steps = sliders[n]["steps"]
        assert [s["label"] for s in steps] == [f"{v:g}" for v in values]
        for step, row in zip(steps, rows):
            assert step["method"] == "restyle" and step["args"][1] == [2 * n + 1]   # only this panel's bars
            y = np.array(step["args"][0]["y"][0], dtype=float)
            assert y.shape == (12,)
            np.testing.assert_allclose(y, row[order].numpy(), atol=1e-4)
        active = steps[sliders[n]["active"]]["args"][0]["y"][0]
        np.testing.assert_allclose(data[2 * n + 1]["y"], active, atol=0)
    # top-k of 1 keeps the likeliest token only; top-p of 0.3 fewer tokens than 0.9
    assert sliders[1]["steps"][0]["args"][0]["y"][0][0] == 1.0
    count = [np.count_nonzero(s["args"][0]["y"][0]) for s in sliders[2]["steps"]]
    assert count == sorted(count) and count[0] < count[-1]
    assert spec_size(e) < 250_000


def test_speculative_explorer_splits_p_into_accepted_and_corrected():
    torch.manual_seed(0)
    T, V = 9, 30
    text = "the queen"
    p = torch.softmax(torch.randn(T, V, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(T, V, dtype=torch.float64) * 2, -1)
    labels = [chr(ord("A") + i) if i < 26 else " .,:"[i - 26] for i in range(V)]
    e = explore.speculative(text, p, q, labels, shown=8)
    spec = e.spec("en")
    steps = spec["layout"]["sliders"][0]["steps"]
    assert len(steps) == T
    accept = torch.minimum(p, q).sum(-1)
    np.testing.assert_allclose(spec["data"][3]["y"], accept.numpy(), atol=1e-4)
    for t, step in enumerate(steps):
        assert step["method"] == "restyle" and step["args"][1] == [0, 1, 2, 4]
        d = step["args"][0]
        order = torch.maximum(p[t], q[t]).argsort(descending=True)[:8]
        names = [{" ": "␣"}.get(labels[i], labels[i]) for i in order]
        assert d["x"][0] == d["x"][1] == d["x"][2] == names
        keep, fix, qq = (np.array(d["y"][i], dtype=float) for i in range(3))
        assert keep.shape == fix.shape == qq.shape == (8,)
        np.testing.assert_allclose(keep, torch.minimum(p[t], q[t])[order].numpy(), atol=1e-4)
        np.testing.assert_allclose(fix, (p[t] - q[t]).clamp(min=0)[order].numpy(), atol=1e-4)
        np.testing.assert_allclose(keep + fix, p[t][order].numpy(), atol=2e-4)         # the two parts make p
        np.testing.assert_allclose(qq, q[t][order].numpy(), atol=1e-4)
        np.testing.assert_allclose(d["customdata"][0], p[t][order].numpy(), atol=1e-4)
        assert d["x"][3] == [t] and abs(d["y"][3][0] - accept[t].item()) < 1e-4
    assert spec_size(e) < 250_000


def test_speculative_explorer_needs_one_distribution_per_character():
    p = torch.full((4, 3), 1 / 3)
    with pytest.raises(AssertionError):
        explore.speculative("abc", p, p, ["a", "b", "c"])


def test_window_with_sinks_shows_the_masks_and_the_bounded_cache():
    """Each window's step draws the mask (1: the window's keys, 2: the sinks' alone) and counts each query's keys,
    which stop growing at W without sinks and at W + sinks with them."""
    T, sinks, windows = 24, 4, [1, 2, 4, 8, 16, 24]
    plain = {w: llm.sliding_window_mask(T, T, w) for w in windows}
    kept = {w: llm.sliding_window_mask(T, T, w, sinks=sinks) for w in windows}
    e = explore.window_with_sinks(plain, kept, sinks, start=2)
    spec = e.spec("en")
    steps = controls(spec)
    assert [label for label, _, _ in steps] == [str(w) for w in windows]
    assert spec["layout"]["sliders"][0]["active"] == 2 and np.array_equal(spec["data"][0]["z"], steps[2][2][0]["z"][0])
    for w, (_, method, (data, layout, traces)) in zip(windows, steps):
        assert method == "update" and traces == [0, 2, 3]
        z = np.array(data["z"][0])
        assert np.array_equal(z == 1, plain[w].numpy()) and np.array_equal(z > 0, kept[w].numpy())
        assert (z == 2).sum() == sum(max(0, min(sinks, t - w + 1)) for t in range(T))     # sinks outside the window
        without, with_sinks = data["y"][1], data["y"][2]
        assert without == [min(t + 1, w) for t in range(T)]
        assert with_sinks == [min(t + 1, w + sinks) for t in range(T)]       # the rolling cache's bound
        assert layout["title.text"] == f"Window W = {w} and {sinks} sinks: a query sees at most {min(T, w + sinks)} of {T} keys"
    assert spec["data"][1]["y"] == [t + 1 for t in range(T)]                 # full attention, never restyled
    assert spec_size(e) < 100_000
    from test_explore import untranslated
    assert untranslated(spec) == []              # the titles that the slider sets included


def test_window_with_sinks_refuses_masks_that_do_not_fit():
    with pytest.raises(AssertionError, match="every mask"):
        explore.window_with_sinks({2: torch.ones(4, 4, dtype=torch.bool)}, {2: torch.ones(4, 5, dtype=torch.bool)}, 1)
    with pytest.raises(AssertionError, match="take none away"):
        explore.window_with_sinks({2: torch.ones(4, 4, dtype=torch.bool)}, {2: torch.eye(4, dtype=torch.bool)}, 1)


def test_chapter_sizes():
    """The three explorers at the notebook's sizes: a 42-character line, 2 layers of 4 heads, 67 tokens."""
    torch.manual_seed(0)
    V, T = 67, 42
    model = llm.GPT(vocab_size=V, block_size=64, n_layer=2, n_head=4, n_embd=64).eval()
    idx = torch.randint(0, V, (1, T))
    text = "".join(chr(ord("a") + i % 26) for i in idx[0].tolist())
    labels = [chr(ord("a") + i % 26) + str(i // 26) for i in range(V)]
    with torch.no_grad():
        logits = model(idx)[0]
    p, q = llm.next_token_probs(logits), llm.next_token_probs(logits, temperature=2.0)
    ts, ks, ps = [0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 3], [1, 2, 3, 4, 5, 8, 10, 15, 20], [0.1, 0.2, 0.5, 0.9, 0.99]
    last = logits[-1]
    sizes = [spec_size(explore.gpt_attention(text, explore.gpt_attention_weights(model, idx))),
             spec_size(explore.sampling(labels, llm.next_token_probs(last), ts,
                                        [llm.next_token_probs(last, temperature=t) for t in ts], ks,
                                        [llm.next_token_probs(last, top_k=k) for k in ks], ps,
                                        [llm.next_token_probs(last, top_p=x) for x in ps])),
             spec_size(explore.speculative(text, p, q, labels))]
    assert max(sizes) < 250_000 and sum(sizes) < 800_000, sizes
