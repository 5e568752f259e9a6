"""Chapter 07's explorers show the chapter's own quantities: a ViT's attention over its patches, and the
shifted-window mask with the cyclic roll it belongs to."""
import json
import re

import numpy as np
import pytest
import torch

from attncourse import explore, images
from attncourse_ref import vision


def spec_size(e):
    return len(json.dumps(e.spec("en")))


@pytest.fixture(scope="module")
def vit_run():
    torch.manual_seed(0)
    vit = vision.ViT(image_size=8, patch_size=4, in_channels=1, num_classes=10, d_model=16, depth=2, num_heads=4,
                     mlp_dim=32).eval()
    with torch.no_grad():
        for p in vit.parameters():
            p.add_(torch.randn_like(p) * 0.3)          # attention far from uniform
    x = torch.randn(3, 1, 8, 8)
    weights = images.capture_attention(vit, x)
    raw = torch.rand(3, 1, 8, 8)
    return vit, x, weights, raw


def test_vit_attention_shows_each_query_over_the_patches(vit_run):
    vit, x, weights, raw = vit_run
    assert len(weights) == 2 and weights[0].shape == (3, 4, 5, 5)
    labels, predicted = torch.tensor([3, 1, 4]), torch.tensor([3, 7, 4])
    e = explore.vit_attention(raw, weights, labels, predicted)
    spec = e.spec("en")
    data = spec["data"]
    assert len(data) == 6                                   # per digit: the attention, then the digit on top
    for k in range(3):
        np.testing.assert_allclose(data[2 * k + 1]["z"], raw[k, 0].numpy(), atol=1e-4)
        assert data[2 * k]["x"] == data[2 * k]["y"] == [1.5, 5.5]   # each patch's cell covers its 4 x 4 pixels
    buttons = spec["layout"]["updatemenus"][0]["buttons"]
    labels_seen = [b["label"] for b in buttons]
    assert labels_seen == [f"layer {l}: the class token" if q == 0 else f"layer {l}: patch {q}"
                           for l in (1, 2) for q in range(5)]
    for n, b in enumerate(buttons):
        layer, query = divmod(n, 5)
        mean = weights[layer].mean(1)                      # [K, 5, 5], over the heads
        assert b["method"] == "update" and b["args"][2] == [0, 2, 4]
        for k, z in enumerate(b["args"][0]["z"]):
            z = np.array(z, dtype=float)
            assert z.shape == (2, 2)
            np.testing.assert_allclose(z, mean[k, query, 1:].reshape(2, 2).numpy(), atol=1e-4)
        notes = [a["text"] for a in b["args"][1]["annotations"]]
        assert notes[:3] == ["label 3, predicted 3", "label 1, predicted 7", "label 4, predicted 4"]
        own = [float(re.fullmatch(r"weight on the class token: ([0-9.]+)", t).group(1)) for t in notes[3:]]
        np.testing.assert_allclose(own, mean[:, query, 0].numpy(), atol=6e-4)
        shapes = b["args"][1]["shapes"]
        if query == 0:
            assert shapes == []
        else:                                              # the query patch outlined on every digit
            r, c = divmod(query - 1, 2)
            assert len(shapes) == 3
            assert {(s["x0"], s["y0"], s["x1"], s["y1"]) for s in shapes} == {(4 * c - 0.5, 4 * r - 0.5,
                                                                               4 * c + 3.5, 4 * r + 3.5)}
            assert [s["xref"] for s in shapes] == ["x", "x2", "x3"]
    first = buttons[0]["args"][0]["z"]
    for k in range(3):
        np.testing.assert_allclose(data[2 * k]["z"], first[k], atol=0)
    assert spec_size(e) < 250_000


def test_vit_attention_at_the_notebooks_size(vit_run):
    vit, _, _, _ = vit_run
    x = torch.randn(8, 1, 8, 8)
    e = explore.vit_attention(torch.rand(8, 1, 8, 8), images.capture_attention(vit, x), torch.arange(8),
                              torch.arange(8))
    assert spec_size(e) < 250_000


@pytest.mark.parametrize("H, W, M", [(8, 12, 4), (6, 6, 3)])
def test_swin_shift_shows_the_mask_and_the_roll(H, W, M):
    masks = [vision.shifted_window_mask(H, W, M, s) for s in range(M)]
    e = explore.swin_shift(H, W, M, masks)
    spec = e.spec("en")
    steps = spec["layout"]["sliders"][0]["steps"]
    assert [s["label"] for s in steps] == [str(s) for s in range(M)]
    nh, nw, n = H // M, W // M, M * M
    numbers = torch.arange(H * W).reshape(H, W)
    for s, step in enumerate(steps):
        assert step["method"] == "update" and step["args"][2] == [0, 1, 2]
        original, rolled, canvas = (np.array(z, dtype=object) for z in step["args"][0]["z"])
        assert original.shape == rolled.shape == (H, W)
        assert canvas.shape == (nh * (n + 1) - 1, nw * (n + 1) - 1)
        # the rolled map holds the image's tokens moved by (-s, -s); the groups move with them
        assert step["args"][0]["text"][1] == torch.roll(numbers, (-s, -s), (0, 1)).tolist()
        assert (np.roll(rolled.astype(int), (s, s), (0, 1)) == original.astype(int)).all()
        mask = masks[s]
        for k in range(nh * nw):
            wy, wx = divmod(k, nw)
            block = canvas[wy * (n + 1):wy * (n + 1) + n, wx * (n + 1):wx * (n + 1) + n].astype(float)
            np.testing.assert_array_equal(block, mask[k].numpy())              # the mask, number for number
            colours = rolled[wy * M:(wy + 1) * M, wx * M:(wx + 1) * M].reshape(-1)
            same = colours[:, None] == colours[None, :]
            np.testing.assert_array_equal(same, (mask[k] == 0).numpy())     # one colour: may attend
        assert all(canvas[wy * (n + 1) - 1, c] is None for wy in range(1, nh) for c in range(canvas.shape[1]))
        groups = len(set(rolled.reshape(-1).tolist()))
        assert groups == (nh * nw if s == 0 else (nh + 1) * (nw + 1))
        # window borders: on the rolled map every M tokens; on the map as it is, shifted by s
        lines = step["args"][1]["shapes"]
        rows0 = sorted(l["y0"] + 0.5 for l in lines if l["xref"] == "x" and l["y0"] == l["y1"])
        assert rows0 == list(range(s if s else M, H, M))
        rows1 = sorted(l["y0"] + 0.5 for l in lines if l["xref"] == "x2" and l["y0"] == l["y1"])
        assert rows1 == list(range(M, H, M))
    active = spec["layout"]["sliders"][0]["active"]
    assert active == M // 2                                 # the figure opens at Swin's shift
    assert [t["z"] for t in spec["data"]] == steps[active]["args"][0]["z"]
    assert spec["layout"]["shapes"] == steps[active]["args"][1]["shapes"]
    assert spec_size(e) < 250_000


def test_swin_shift_rejects_a_mask_of_the_wrong_shape():
    with pytest.raises(AssertionError, match="expected"):
        explore.swin_shift(8, 8, 4, [torch.zeros(4, 16, 15)])
