"""Chapter 01's explorers (attncourse.explore.ch01): each shows the attention weights it is given, as the
chapter computes them (additive attention of a decoder state over encoder states), in every state of its
control, with the characters where they belong; the specs stay small."""
import json

import numpy as np
import pytest
import torch

from attncourse import explore

TEXTS = ["21/11/26", "November 21, 2026", "saturday, 21 november 2026"]
OUTPUTS = [list("2026-11-21"), list("2026-11-21"), list("2026-11-2")]      # the last one stopped a step early


def additive_weights(n_out, n_in, seed):
    """a_{t,i} = softmax_i(v . tanh(W_q s_{t-1} + W_k h_i)) for random states: the chapter's weights."""
    g = torch.Generator().manual_seed(seed)
    s, h = torch.randn(n_out, 8, generator=g), torch.randn(n_in, 6, generator=g)
    w_q, w_k, v = torch.randn(5, 8, generator=g), torch.randn(5, 6, generator=g), torch.randn(5, generator=g)
    scores = torch.tanh((s @ w_q.T)[:, None, :] + (h @ w_k.T)[None, :, :]) @ v
    return torch.softmax(2 * scores, dim=-1)


@pytest.fixture(scope="module")
def weights():
    return [additive_weights(len(out), len(text), seed) for seed, (text, out) in enumerate(zip(TEXTS, OUTPUTS))]


def steps(spec):
    control = (spec["layout"].get("sliders") or spec["layout"]["updatemenus"])[0]
    return control.get("steps") or control["buttons"]


def test_alignment_shows_each_dates_weights_with_its_characters(weights):
    spec = explore.alignment(TEXTS, OUTPUTS, weights).spec("en")
    buttons = steps(spec)
    assert [b["label"] for b in buttons] == TEXTS and spec["layout"]["updatemenus"][0]["name"]
    for text, out, w, b in zip(TEXTS, OUTPUTS, weights, buttons):
        assert b["method"] == "update" and set(b["args"][0]) == set(buttons[0]["args"][0])
        data, axes = b["args"]
        z = np.array(data["z"][0], dtype=float)
        assert z.shape == (len(out), len(text)) and np.allclose(z, w.numpy(), atol=1e-4)
        assert np.allclose(z.sum(-1), 1, atol=1e-3)
        assert data["x"][0] == axes["xaxis.tickvals"] == list(range(1, len(text) + 1))
        assert data["y"][0] == axes["yaxis.tickvals"] == list(range(1, len(out) + 1))
        assert axes["xaxis.ticktext"] == list(text) and axes["yaxis.ticktext"] == out
        cells = data["customdata"][0]                      # [output character, input character] per cell
        assert all(cells[r][c] == [out[r], text[c]] for r in range(len(out)) for c in range(len(text)))
    first = spec["data"][0]
    assert np.allclose(first["z"], weights[0].numpy(), atol=1e-4)
    assert spec["layout"]["xaxis"]["ticktext"] == list(TEXTS[0])


def test_output_step_shows_one_step_of_every_date(weights):
    spec = explore.output_step(TEXTS, OUTPUTS, weights).spec("en")
    width = max(map(len, TEXTS))
    shown = steps(spec)
    assert [s["label"] for s in shown] == [f"{t + 1} ({c})" for t, c in enumerate("YYYY-MM-DD")]
    heat = spec["data"][0]
    assert heat["text"] == [list(t) + [""] * (width - len(t)) for t in TEXTS]        # the characters stay put
    for t, s in enumerate(shown):
        z = s["args"][0]["z"][0]
        assert len(z) == len(TEXTS) and all(len(row) == width for row in z)          # every step: the same shape
        for r, (text, out, w) in enumerate(zip(TEXTS, OUTPUTS, weights)):
            if t < len(out):
                assert np.allclose(z[r][:len(text)], w[t].numpy(), atol=1e-4)
                assert s["args"][1]["yaxis.ticktext"][r].endswith(f"→ {out[t]}")
            else:
                assert all(v is None for v in z[r])                                # no such step: empty row
            assert all(v is None for v in z[r][len(text):])                         # past the input: empty
    assert np.allclose(np.array(heat["z"][1][:len(TEXTS[1])], dtype=float), weights[1][0].numpy(), atol=1e-4)


def reversal_examples():
    """Held-out digit strings with their targets, outputs and weights: two right and one wrong of length 4,
    one right of length 2 (no wrong one at that length)."""
    rows = []
    for seed, (src, out) in enumerate([("0570", "0750"), ("1234", "4321"), ("0570", "0700"), ("52", "25"),
                                       ("1111", "1111")]):
        rows.append((src, src[::-1], list(out), additive_weights(len(out), len(src), 10 + seed)))
    return rows


def test_reversal_shows_a_right_and_a_wrong_string_per_length():
    examples = reversal_examples()
    spec = explore.reversal(examples, {2: 1.0, 4: 0.25}).spec("en")
    shown = steps(spec)
    assert [s["label"] for s in shown] == ["2", "4"]
    by_label = {s["label"]: s["args"] for s in shown}
    data, axes = by_label["4"]
    right, wrong = examples[0], examples[2]             # the first right and the first wrong of length 4
    for panel, (src, tgt, out, w) in enumerate((right, wrong)):
        z = np.array(data["z"][panel], dtype=float)
        assert z.shape == (len(out), len(src)) and np.allclose(z, w.numpy(), atol=1e-4)
        cells = data["customdata"][panel]               # [written, wanted, read] per cell
        assert all(cells[r][c] == [out[r], tgt[r], src[c]] for r in range(len(out)) for c in range(len(src)))
        x, y = ("xaxis", "yaxis") if panel == 0 else ("xaxis2", "yaxis2")
        assert axes[f"{x}.ticktext"] == list(src) and axes[f"{y}.ticktext"] == out
    assert "25%" in axes["title"]["text"]
    data, axes = by_label["2"]
    assert np.allclose(np.array(data["z"][0], dtype=float), examples[3][3].numpy(), atol=1e-4)
    assert data["z"][1] == [[None]] and axes["xaxis2.ticktext"] == []              # none wrong at length 2
    assert "100%" in axes["title"]["text"]
    for s in shown:                                     # every state updates the same traces and axes
        assert set(s["args"][0]) == set(shown[0]["args"][0]) and set(s["args"][1]) == set(shown[0]["args"][1])
        assert len(s["args"][0]["z"]) == 2
    assert spec["layout"]["title"]["text"] == by_label["2"][1]["title"]["text"]     # starts at the shortest


def test_specs_are_small_and_draw_a_still():
    import random
    rnd = random.Random(0)
    texts = ["".join(rnd.choice("abcdefgh 0123456789") for _ in range(n)) for n in range(8, 28, 2)]
    outs = [list("2026-11-21")] * len(texts)
    ws = [additive_weights(10, len(t), i) for i, t in enumerate(texts)]
    digits = ["".join(rnd.choice("0123456789") for _ in range(n)) for n in range(1, 11) for _ in range(2)]
    rev = [(s, s[::-1], list(s[::-1] if i % 2 else s), additive_weights(len(s), len(s), i)) for i, s in enumerate(digits)]
    for e in (explore.alignment(texts, outs, ws), explore.output_step(texts, outs, ws),
              explore.reversal(rev, {n: 0.5 for n in range(1, 11)})):
        assert len(json.dumps(e.spec("en"))) < 100_000, e.name
        assert e.still_png()[:8] == b"\x89PNG\r\n\x1a\n"
        assert e.alt and e.hint


def test_every_label_is_in_the_chinese_catalogue(weights):
    """Every reader-visible string with English words comes out in Chinese (after `make translations`)."""
    from test_explore import untranslated
    for e in (explore.alignment(TEXTS, OUTPUTS, weights), explore.output_step(TEXTS, OUTPUTS, weights),
              explore.reversal(reversal_examples(), {2: 1.0, 4: 0.25})):
        spec = e.spec("en")
        data_strings = set(TEXTS)                        # the dates themselves are data, not labels
        assert [s for s in untranslated(spec) if s not in data_strings] == [], e.name
