"""Chapter 03's explorers: each shows the chapter's own quantities (a multi-head layer's per-head weights, the
state of the online softmax after each block of keys, the sliding-window masks), every state has the
first state's shape, and the figures are small."""
import json
import math
import re

import numpy as np
import pytest
import torch

from attncourse import explore
from attncourse_ref import multihead as ref

TOKENS = ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired"]


def states(spec, key, control=None):
    """[(label, args)] of every slider step and menu button of ``spec`` whose data update sets ``key``."""
    out = []
    controls = spec["layout"].get("sliders", []) + spec["layout"].get("updatemenus", [])
    for c in controls if control is None else [spec["layout"][control][0]]:
        for step in c.get("steps", c.get("buttons", [])):
            if key in step["args"][0]:
                out.append((step["label"], step["args"]))
    return out


def small(e):
    size = len(json.dumps(e.spec("en")))
    assert size < 250_000, (e.name, size)
    return size


# ---------------------------------------------------------------------------------------------------
# heads: one layer's per-head weights, and their mean

def test_heads_shows_every_heads_weights_and_their_mean():
    torch.manual_seed(0)
    mha = ref.MultiHeadAttention(24, 4)
    x = torch.randn(1, len(TOKENS), 24) * 2
    with torch.no_grad():
        _, weights = mha(x, x, x)                                   # [1, 4, N, N], what the notebook passes
    spec = explore.heads(TOKENS, weights[0]).spec("en")
    shown = states(spec, "z")
    assert len(shown) == 5
    for h in range(4):
        label, (data, *_) = shown[h]
        assert label.startswith(f"head {h}: ") and label[len(f"head {h}: "):] == explore.ROLES[h]
        z = np.array(data["z"][0])
        assert z.shape == (len(TOKENS), len(TOKENS))
        assert np.allclose(z, weights[0, h].numpy(), atol=1e-4)
        assert data["zmax"][0] >= z.max() - 1e-9                   # the colour scale holds the whole map
    label, (data, *_) = shown[4]
    assert label.startswith("mean of the 4 heads")
    assert np.allclose(data["z"][0], weights[0].mean(0).numpy(), atol=1e-4)
    assert np.allclose(np.array(data["z"][0]).sum(-1), 1, atol=1e-3)
    # the figure opens on head 0, labelled with the sentence
    assert np.allclose(spec["data"][0]["z"], weights[0, 0].numpy(), atol=1e-4)
    assert spec["data"][0]["x"] == TOKENS and spec["data"][0]["y"] == TOKENS
    small(explore.heads(TOKENS, weights[0]))


def test_heads_rejects_weights_of_the_wrong_shape():
    with pytest.raises(ValueError, match="heads expects weights"):
        explore.heads(TOKENS, torch.rand(1, 4, len(TOKENS), len(TOKENS)))    # the batch axis left in


# ---------------------------------------------------------------------------------------------------
# online_softmax: the running max, the running sum and the output after each block of keys

def _online(scores, v, block):
    """The chapter's update, written out: (m, l, acc / l, rescale factor) after each block of keys."""
    m, l, acc, out = -math.inf, 0.0, np.zeros(v.shape[1]), []
    for start in range(0, len(scores), block):
        s = scores[start:start + block]
        m_new = max(m, float(s.max()))
        rescale = math.exp(m - m_new)
        l = l * rescale + float(np.exp(s - m_new).sum())
        acc = acc * rescale + np.exp(s - m_new) @ v[start:start + block]
        m = m_new
        out.append((m, l, acc / l, rescale))
    return out


@pytest.mark.parametrize("n, block", [(32, 4), (30, 8)])            # 30 = 3 blocks of 8 and a short one
def test_online_softmax_shows_the_state_after_each_block(n, block):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(6, 16, generator=g), torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g)
    scores = (q @ k.T / math.sqrt(16)).double()
    row = int(scores.argmax(-1).argmax())                           # as the notebook: the max comes late
    ends = list(range(block, n, block)) + [n]
    partial = torch.cat([ref.tiled_attention(q[row:row + 1], k[:end], v[:end], block) for end in ends])
    full = torch.softmax(scores[row], -1) @ v.double()
    e = explore.online_softmax(scores[row], block, partial, full)
    spec = e.spec("en")
    expected = _online(scores[row].numpy(), v.double().numpy(), block)
    steps = spec["layout"]["sliders"][0]["steps"]
    assert [s["label"] for s in steps] == [str(t + 1) for t in range(len(ends))]
    first = None
    for t, (step, end, (m, l, out, rescale)) in enumerate(zip(steps, ends, expected)):
        data, layout, traces = step["args"]
        assert step["method"] == "update" and traces == [0, 1, 2, 4]
        colors, m_line, terms, shown_out = data["marker.color"][0], data["y"][1], np.array(data["y"][2]), data["y"][3]
        assert np.allclose(data["y"][0], scores[row].numpy(), atol=1e-4)
        assert sum(c == colors[0] for c in colors) == end and len(set(colors[:end])) == 1   # the keys read so far
        assert np.allclose(m_line, [m, m], atol=1e-4)
        assert np.allclose(terms[:end], np.exp(scores[row, :end].numpy() - m), atol=1e-4)
        assert np.all(terms[end:] == 0)
        assert math.isclose(terms.sum(), l, rel_tol=1e-3)
        assert np.allclose(shown_out, out, atol=1e-4)               # the learner's tiled output = acc / l
        title = layout["title.text"]
        assert f"Block {t + 1} of {len(ends)}" in title
        assert float(re.search(r"running max (-?[\d.]+)", title).group(1)) == pytest.approx(m, abs=1e-3)
        assert float(re.search(r"running sum ℓ = ([\d.]+)", title).group(1)) == pytest.approx(l, abs=1e-3)
        assert float(re.search(r"= ([\d.]+)$", title).group(1)) == pytest.approx(rescale, abs=1e-3)
        shapes = [np.shape(y) for y in data["y"]] + [np.shape(colors)]
        first = first or shapes
        assert shapes == first
    assert any(0 < r < 1 for *_, r in expected[1:])                  # a later block raised the max
    # after the last block: the terms are the final markers and the output is full attention's
    last = steps[-1]["args"][0]["y"]
    assert np.allclose(last[2], spec["data"][3]["y"], atol=1e-4)
    assert np.allclose(last[3], full.numpy(), atol=1e-4) and np.allclose(spec["data"][5]["y"], full.numpy(), atol=1e-4)
    small(e)


def test_online_softmax_shows_the_given_outputs_not_its_own():
    scores = torch.tensor([0.0, 1.0, 3.0, 2.0])
    wrong = torch.full((2, 3), 7.0)                                  # a learner's broken tiled_attention
    spec = explore.online_softmax(scores, 2, wrong, torch.zeros(3)).spec("en")
    assert all(s["args"][0]["y"][3] == [7.0] * 3 for s in spec["layout"]["sliders"][0]["steps"])


# ---------------------------------------------------------------------------------------------------
# sliding_window: the masks of every window, alone and causal

def test_sliding_window_shows_the_masks_and_counts_their_scores():
    n = 12
    masks = {w: ref.sliding_window_mask(n, w) for w in range(n)}
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    both = {w: masks[w] & causal for w in range(n)}
    e = explore.sliding_window(n, masks, both)
    spec = e.spec("en")
    steps = spec["layout"]["sliders"][0]["steps"]
    assert [s["label"] for s in steps] == [str(w) for w in range(n)]
    for w, step in enumerate(steps):
        data, layout = step["args"]
        z0, z1 = np.array(data["z"][0]), np.array(data["z"][1])
        assert z0.shape == z1.shape == (n, n)
        assert np.array_equal(z0, masks[w].numpy().astype(float)) and np.array_equal(z1, both[w].numpy().astype(float))
        kept = int(masks[w].sum())
        assert kept == sum(min(n, i + w + 1) - max(0, i - w) for i in range(n))   # |i - j| <= w, counted
        assert layout["title.text"] == f"Window w = {w}: {kept} of {n * n} scores both sides, {int(both[w].sum())} with a causal mask"
    assert np.array_equal(np.array(steps[-1]["args"][0]["z"][0]), np.ones((n, n)))   # the widest: full attention
    assert np.array_equal(np.array(steps[-1]["args"][0]["z"][1]), causal.numpy().astype(float))
    small(e)
