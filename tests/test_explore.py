"""The explorers' core (attncourse.explore) and chapters 00 and 02's explorers: the numbers each shows are the
chapter's, every state has the first state's shape, the labels translate, and the site's element is sound.
(Chapters 01 and 03-09: tests/test_explore_chNN.py.)"""
import json
import math

import numpy as np
import pytest
import torch

from attncourse import explore


def states(spec, key):
    """The values of ``key`` in every slider step and menu button of ``spec``: [(label, value)]."""
    out = []
    for control in spec["layout"].get("sliders", []) + spec["layout"].get("updatemenus", []):
        for step in control.get("steps", control.get("buttons", [])):
            out.append((step["label"], step["args"][0][key]))
    return out


def untranslated(spec):
    """The reader-visible strings of ``spec`` that have English words and that the Chinese catalogue leaves as they are."""
    import re
    out = []
    for en, zh in zip(explore.strings(spec), explore.strings(explore.localize(spec, "zh"))):
        words = [w for w in re.findall(r"[A-Za-z]{2,}", en.replace("<extra></extra>", "").replace("<br>", " "))
                 if w not in {"sqrt", "cos", "softmax", "Softmax"}]
        if words and zh == en:
            out.append(en)
    return out


def test_temperature_shows_the_softmax_at_every_temperature():
    logits = torch.tensor([4.0, 2.6, 2.2, 1.7, 0.8])
    temps = [0.1, 0.5, 1.0, 2.0, 10.0]
    spec = explore.temperature(list("abcde"), logits, temps).spec("en")
    shown = states(spec, "y")
    assert [label for label, _ in shown] == ["0.1", "0.5", "1", "2", "10"]
    for t, (_, y) in zip(temps, shown):
        assert np.allclose(y[0], torch.softmax(logits / t, -1).numpy(), atol=1e-4)
    assert spec["layout"]["sliders"][0]["active"] == 2                  # starts at T = 1
    assert np.allclose(spec["data"][0]["y"], torch.softmax(logits, -1).numpy(), atol=1e-4)
    # given probabilities (the learner's softmax) are shown as they are, not recomputed
    mine = torch.full((5, 5), 0.2)
    assert all(np.allclose(y[0], 0.2) for _, y in states(explore.temperature(list("abcde"), logits, temps, mine).spec("en"), "y"))


def test_dot_product_follows_the_lengths_and_the_cosine():
    spec = explore.dot_product(a_length=math.sqrt(5), b_length=2.0, angles=[0, 60, 90, 180]).spec("en")
    curve = spec["data"][2]
    assert np.allclose(curve["y"], [2 * math.sqrt(5) * math.cos(math.radians(a)) for a in [0, 60, 90, 180]], atol=1e-4)
    for (label, x), (_, y) in zip(states(spec, "x"), states(spec, "y")):
        angle = math.radians(float(label.rstrip("°")))
        b = np.array([x[0][1], y[0][1]])
        assert np.allclose(b, [2 * math.cos(angle), 2 * math.sin(angle)], atol=1e-4)     # the turning arrow
        a = np.array([math.sqrt(5), 0.0])
        assert math.isclose(y[1][0], float(a @ b), abs_tol=1e-3)                         # the marker on the curve


def test_scaling_shows_the_given_weights_per_dimension():
    dims = [4, 64, 1024]
    g = torch.Generator().manual_seed(0)
    raw, scaled = [], []
    for d in dims:
        q, x = torch.randn(d, generator=g), torch.randn(16, d, generator=g)
        raw.append(torch.softmax(x @ q, -1).sort(descending=True).values)
        scaled.append(torch.softmax(x @ q / math.sqrt(d), -1).sort(descending=True).values)
    spec = explore.scaling(dims, raw, scaled).spec("en")
    for i, (label, y) in enumerate(states(spec, "y")):
        assert label == str(dims[i])
        assert np.allclose(y[0], raw[i], atol=1e-4) and np.allclose(y[1], scaled[i], atol=1e-4)
    # what the explorer is for: unscaled saturates at d = 1024, scaled does not
    assert states(spec, "y")[-1][1][0][0] > 0.9 > states(spec, "y")[-1][1][1][0]


def test_masks_show_the_attention_weights_under_each_mask():
    tokens = list("abcdef")
    q, k = torch.randn(6, 4), torch.randn(6, 4)
    pad = (torch.arange(6) < 4).expand(6, 6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    masks = {"none": None, "padding": pad, "causal": causal, "both": pad & causal}
    weights = {}
    for name, m in masks.items():
        s = q @ k.T / 2
        weights[name] = torch.softmax(s if m is None else s.masked_fill(~m, float("-inf")), -1)
    spec = explore.masks(tokens, weights).spec("en")
    shown = states(spec, "z")
    assert [label for label, _ in shown] == [explore.MASKS[k] for k in masks]
    for (name, w), (_, z) in zip(weights.items(), shown):
        z = np.array(z[0])
        assert z.shape == (6, 6) and np.allclose(z, w.numpy(), atol=1e-4), name
        assert np.allclose(z.sum(-1), 1, atol=1e-3)
    assert np.all(np.array(shown[2][1][0])[np.triu_indices(6, 1)] == 0)      # causal: nothing right of the diagonal


@pytest.fixture(scope="module")
def samples():
    """One explorer of each kind of chapters 00 and 02."""
    w = {k: torch.softmax(torch.randn(4, 4), -1) for k in explore.MASKS}
    return [explore.temperature(list("abc"), torch.tensor([1.0, 0.0, -1.0])), explore.dot_product(),
            explore.scaling([4, 16], torch.rand(2, 16), torch.rand(2, 16)), explore.masks(list("abcd"), w)]


def test_every_label_has_a_chinese_translation(samples):
    for e in samples:
        assert untranslated(e.spec("en")) == [], e.name
        zh = e.spec("zh")
        for t_zh, t_en in zip(zh["data"], e.spec("en")["data"]):           # the data is not translated
            assert {k: t_zh.get(k) for k in "xyz"} == {k: t_en.get(k) for k in "xyz"}, e.name
        assert "\u4e00" <= zh["layout"]["meta"]["hint"][0] <= "\u9fff" or any(
            "\u4e00" <= c <= "\u9fff" for c in zh["layout"]["meta"]["hint"]), e.name


def test_localize_translates_labels_and_leaves_data_alone():
    spec = {"data": [{"type": "heatmap", "z": [[0.5]], "x": ["causal mask"], "hovertemplate": "weight %{z}"}],
            "layout": {"title": {"text": "causal mask"}, "meta": {"alt": "causal mask", "hint": "no mask"}}}
    zh = explore.localize(spec, "zh")
    assert zh["layout"]["title"]["text"] == "因果掩码" and zh["layout"]["meta"]["hint"] == "无掩码"
    assert zh["data"][0]["x"] == ["causal mask"] and zh["data"][0]["z"] == [[0.5]]   # data: tokens, numbers
    assert explore.localize(spec, "en") is spec
    # A control's step that sets the title by its dotted path: translated too, and listed among the strings.
    spec["layout"]["sliders"] = [{"steps": [{"label": "1", "method": "update", "args": [{}, {"title.text": "no mask"}]}]}]
    assert explore.localize(spec, "zh")["layout"]["sliders"][0]["steps"][0]["args"][1]["title.text"] == "无掩码"
    assert "no mask" in explore.strings({"layout": spec["layout"]["sliders"][0]})


def test_the_notebook_output_carries_the_figure_a_still_and_the_hint(samples):
    for e in samples:
        bundle = e._repr_mimebundle_()
        assert set(bundle) == {explore.MIME, "text/html", "image/png", "text/plain"}
        png = __import__("base64").b64decode(bundle["image/png"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2_000, e.name
        assert bundle[explore.MIME]["layout"]["meta"]["explorer"] == e.name
        assert e.hint in bundle["text/plain"] and e.alt in bundle["text/plain"]
        assert "template" not in bundle[explore.MIME]["layout"]
        assert len(json.dumps(bundle[explore.MIME])) < 250_000


def test_the_site_element_is_drawn_from_the_figure_with_its_labels_in_the_page_language(samples):
    import nbformat

    import build_site
    cell = nbformat.v4.new_code_cell("explore.masks(...)")
    bundle = samples[3]._repr_mimebundle_()
    bundle[explore.MIME]["layout"]["title"]["text"] = "causal mask"
    bundle[explore.MIME]["data"][0]["x"][0] = "a </script><script>alert(1)</script>"      # a token of the data
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    for lang, title in (("en", "causal mask"), ("zh", "因果掩码")):
        out = build_site.explorers_for_site(nb, lang).cells[0].outputs[0]["data"]
        assert list(out) == ["text/html"]
        html = out["text/html"]
        assert html.count("</script>") == 1                         # a label cannot close the data's script
        data = json.loads(html.split('class="attn-spec">')[1].split("</script>")[0].replace("<\\/", "</"))
        assert data["layout"]["title"]["text"] == title and data["data"][0]["x"][0].startswith("a </script>")
        assert 'id="explorer-masks"' in html and "<noscript><img" in html and "cdn.plot.ly" not in html
        assert f'aria-label="{__import__("html").escape(data["layout"]["meta"]["alt"])}"' in html
