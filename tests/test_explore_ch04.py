"""Chapter 04's explorers (attncourse.explore.ch04): the sinusoidal clock shows the table it is given and its
dot products, RoPE shows the rotated query and key it is given and their scores, in every state of every
control; the specs stay small."""
import json
import math

import numpy as np
import pytest
import torch

from attncourse import explore


def sinusoidal_table(n, d):
    """The chapter's formula, written out: table[pos, 2i] = sin(pos w_i), table[pos, 2i+1] = cos(pos w_i)."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * w), torch.cos(pos * w)
    return table


def apply_rope(x, positions):
    """The chapter's RoPE, written out: pair (2i, 2i+1) of row n turned by positions[n] * w_i."""
    d = x.shape[-1]
    angle = positions[:, None].double() * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(angle), torch.sin(angle)
    out = x.clone()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def steps(control):
    return [(s["label"], s["method"], s["args"]) for s in control["steps"]]


def test_sinusoidal_clock_shows_the_table_and_its_dot_products():
    pe = sinusoidal_table(40, 16)
    spec = explore.sinusoidal(pe).spec("en")
    radius = np.linspace(1.0, 0.25, 8)
    hands, curve, now = spec["data"]
    shown = steps(spec["layout"]["sliders"][0])
    assert [label for label, _, _ in shown] == [str(p) for p in range(40)]
    dots = (pe @ pe.T).numpy()
    for p, (_, method, (update, traces)) in enumerate(shown):
        assert method == "restyle" and traces == [0, 1, 2]
        x, y = np.array(update["x"][0]), np.array(update["y"][0])
        assert x.shape == y.shape == (8,)                                        # the first state's shape
        assert np.allclose(x / radius, pe[p, 1::2].numpy(), atol=1e-3)          # cosine: dimension 2i + 1
        assert np.allclose(y / radius, pe[p, 0::2].numpy(), atol=1e-3)          # sine: dimension 2i
        assert update["x"][1] is None                                           # the curve keeps x0, dx
        assert np.allclose(update["y"][1], dots[p], atol=1e-4) and len(update["y"][1]) == 40
        assert update["x"][2] == [p] and math.isclose(update["y"][2][0], dots[p, p], abs_tol=1e-4)
    assert np.allclose(hands["x"], radius * pe[0, 1::2].numpy(), atol=1e-4)
    assert np.allclose(curve["y"], dots[0], atol=1e-4) and curve["x0"] == 0 and curve["dx"] == 1
    # the hover's speeds are the pairs' frequencies w_i, read from the table's row 1
    assert np.allclose([c[3] for c in hands["customdata"]], 10000.0 ** (-np.arange(0, 16, 2) / 16), atol=1e-4)
    # what the explorer is for: the curve of position p is the curve of 0 moved by p (inside the table)
    assert np.allclose(shown[10][2][0]["y"][1][10:30], shown[0][2][0]["y"][1][0:20], atol=1e-3)


def test_sinusoidal_shows_a_learners_table_as_given():
    pe = sinusoidal_table(12, 8)
    pe[:, 0] = 0.5                                          # a wrong table is shown wrong, not recomputed
    spec = explore.sinusoidal(pe).spec("en")
    assert all(math.isclose(u["y"][0][0], 0.5 * 1.0, abs_tol=1e-4) for _, _, (u, _) in steps(spec["layout"]["sliders"][0]))


@pytest.fixture(scope="module")
def rotated():
    torch.manual_seed(0)
    d, n = 32, 24
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    positions = torch.arange(n)
    return apply_rope(q.expand(n, d), positions), apply_rope(k.expand(n, d), positions)


def test_rope_shows_the_rotated_vectors_and_every_score(rotated):
    qs, ks = rotated
    n = qs.shape[0]
    spec = explore.rope(qs, ks, pairs=(0, 4)).spec("en")
    names = [t.get("name") for t in spec["data"]]
    heat = next(t for t in spec["data"] if t["type"] == "heatmap")
    scores = (qs @ ks.T).numpy()
    assert np.allclose(heat["z"], scores, atol=1e-4)
    z = np.array(heat["z"])
    assert all(np.allclose(np.diagonal(z, off), np.diagonal(z, off)[0], atol=1e-3) for off in range(-n + 1, n))
    q_slider, k_slider = spec["layout"]["sliders"]
    for control, vec, crosshair in ((q_slider, qs, "m"), (k_slider, ks, "n")):
        shown = steps(control)
        assert [label for label, _, _ in shown] == [str(p) for p in range(n)]
        for p, (_, method, (update, traces)) in enumerate(shown):
            assert method == "restyle" and len(traces) == 3 and names[traces[2]] == crosshair
            assert [len(v) for v in update["x"]] == [len(v) for v in shown[0][2][0]["x"]]      # the first state's shape
            for j, i in enumerate((0, 4)):                                   # the arrow of pair i: (0, 0) -> vec[p, 2i:2i+2]
                assert np.allclose([update["x"][j][1], update["y"][j][1]], vec[p, 2 * i:2 * i + 2].numpy(), atol=1e-4)
                assert update["x"][j][0] == update["y"][j][0] == 0
            line = update["y"][2] if crosshair == "m" else update["x"][2]
            assert line == [p, p]                                            # the crosshair's row or column
    # the two sliders move separate traces: the query's arrows and row, the key's arrows and column
    assert not set(steps(q_slider)[0][2][1]) & set(steps(k_slider)[0][2][1])


def test_rope_pairs_are_the_chosen_planes(rotated):
    qs, ks = rotated
    spec = explore.rope(qs, ks, pairs=(1,)).spec("en")
    q_steps = steps(spec["layout"]["sliders"][0])
    assert np.allclose([q_steps[5][2][0]["x"][0][1], q_steps[5][2][0]["y"][0][1]], qs[5, 2:4].numpy(), atol=1e-4)
    assert "pair 1" in spec["layout"]["xaxis"]["title"]["text"]


def test_specs_are_small_and_draw_a_still():
    chapter = 0                                              # the notebook's sizes: 100 x 64, and 64 positions
    q, k = torch.randn(2, 32, dtype=torch.float64)
    positions = torch.arange(64)
    rope = explore.rope(apply_rope(q.expand(64, 32), positions), apply_rope(k.expand(64, 32), positions))
    for e in (explore.sinusoidal(sinusoidal_table(100, 64)), rope):
        size = len(json.dumps(e.spec("en")))
        assert size < 250_000, e.name
        chapter += size
        assert e.still_png()[:8] == b"\x89PNG\r\n\x1a\n"
        assert e.alt and e.hint
    assert chapter < 400_000


def test_every_label_is_in_the_chinese_catalogue(rotated):
    """Every reader-visible string with English words comes out in Chinese (after `make translations`)."""
    from test_explore import untranslated
    for e in (explore.sinusoidal(sinusoidal_table(20, 8)), explore.rope(*rotated)):
        assert untranslated(e.spec("en")) == [], e.name
