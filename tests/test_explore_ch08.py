"""Chapter 08's explorers: the numbers each shows are the chapter's (routing, capacity and load computed
as the notebook computes them, on a small MoE language model), every state has the first state's shape,
every label comes from a template of the module (so the catalogue can translate it), and the figures are small."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attncourse import explore, moe_lab
from attncourse.explore import ch08
from attncourse_ref.moe import MoE, RMSNorm, biased_top_k_router, capacity_mask, top_k_router

from explore_helpers import controls, labels_from_templates
E, K, T = 8, 2, 32


@pytest.fixture(scope="module")
def model():
    """A small MoE language model as 8.10 builds it (untrained: the explorers show whatever it routes)."""
    torch.manual_seed(0)
    m = moe_lab.TinyLM(65, 16, 2, 2, T, norm=RMSNorm, ffn=lambda d: MoE(d, 8, E, K))
    with torch.no_grad():
        m.blocks[1].ffn.router.weight[3] += 1.0          # a popular expert, so that capacity drops something
    return m.eval()


@pytest.fixture(scope="module")
def passage():
    return torch.randint(0, 65, (1, T), generator=torch.Generator().manual_seed(1))


def routing(model, passage, layer, bias):
    with torch.no_grad():
        model(passage)
        return biased_top_k_router(model.router_logits()[layer][0], bias, K)


FACTORS = [0.5, 0.75, 1.0, 1.5, 2.0, 4.0]


@pytest.fixture(scope="module")
def capacity_case(model, passage):
    caps = [math.ceil(c * T * K / E) for c in FACTORS]
    biases = {"neither": torch.zeros(E), "load-balancing loss": torch.zeros(E), "bias update": torch.linspace(-1, 1, E)}
    routes = {}
    for label, bias in biases.items():
        gates, chosen = routing(model, passage, 1, bias)
        routes[label] = (gates, chosen, torch.stack([capacity_mask(chosen, E, c) for c in caps]))
    tokens = [chr(97 + int(i) % 26) if i % 7 else " " for i in passage[0]]
    return tokens, caps, routes, explore.capacity(tokens, E, FACTORS, caps, routes, layer=1)


def test_capacity_shows_the_gates_of_the_routing(capacity_case):
    tokens, caps, routes, e = capacity_case
    spec = e.spec("en")
    heatmaps = [t for t in spec["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3
    for heat, (gates, chosen, _) in zip(heatmaps, routes.values()):
        z = heat["z"]
        assert len(z) == E and all(len(row) == T for row in z)
        expected = [[None] * T for _ in range(E)]
        for t in range(T):
            for s in range(K):
                expected[int(chosen[t, s])][t] = float(gates[t, s])
        for e_, row in enumerate(z):
            for t, v in enumerate(row):
                if expected[e_][t] is None:
                    assert v is None, (e_, t)
                else:
                    assert abs(v - expected[e_][t]) < 1e-4, (e_, t)
        assert heat["customdata"][0] == ["␣" if c == " " else c for c in tokens]


def test_capacity_marks_exactly_the_assignments_capacity_mask_rejects(capacity_case):
    tokens, caps, routes, e = capacity_case
    spec = e.spec("en")
    steps = controls(spec)
    assert [label for label, _, _ in steps] == [f"{c:g} (capacity {cap} tokens)" for c, cap in zip(FACTORS, caps)]
    assert spec["layout"]["sliders"][0]["active"] == FACTORS.index(1.0)
    first = steps[0][2]
    dropped_somewhere = False
    for i, (_, method, args) in enumerate(steps):
        update, idx = args
        assert method == "restyle" and idx == first[1] and set(update) == set(first[0])
        for r, (gates, chosen, kept) in enumerate(routes.values()):
            marks_x, marks_y = update["x"][3 * r], update["y"][3 * r]
            want = {(t, int(chosen[t, s])) for t in range(T) for s in range(K) if not kept[i, t, s]}
            assert set(zip(marks_x, marks_y)) == want and len(marks_x) == len(want)
            dropped_somewhere |= bool(want)
            kept_counts = update["x"][3 * r + 1]
            assert kept_counts == torch.bincount(chosen[kept[i]], minlength=E).tolist()
            assert max(kept_counts) <= caps[i] and len(update["y"][3 * r + 1]) == E
            assert update["x"][3 * r + 2] == [caps[i], caps[i]]
        for j, trace in enumerate(idx):         # every state restyles traces of one kind, with a list each
            assert spec["data"][trace]["type"] == spec["data"][first[1][j]]["type"]
    assert dropped_somewhere
    # the figure opens at factor 1: its traces hold that state
    start = steps[FACTORS.index(1.0)][2]
    for j, trace in enumerate(start[1]):
        assert spec["data"][trace]["x"] == start[0]["x"][j]
    routed = [t for t in spec["data"] if t.get("name") == "tokens routed"]
    for bar, (_, chosen, _) in zip(routed, routes.values()):
        assert bar["x"] == torch.bincount(chosen.flatten(), minlength=E).tolist()


def record(model, batches, bias=None):
    """What 8.10's record_load keeps after each step: each layer's share of the assignments per expert."""
    out = []
    with torch.no_grad():
        for x in batches:
            model(x)
            chosen = [top_k_router(b.router_logits, K)[1] if bias is None else
                      biased_top_k_router(b.router_logits, bias, K)[1] for b in model.blocks]
            out.append(torch.stack([torch.bincount(c.flatten(), minlength=E) / c.numel() for c in chosen]))
    return torch.stack(out)


@pytest.fixture(scope="module")
def load_case(model):
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 65, (4, T), generator=g) for _ in range(12)]
    loads = {"neither": record(model, batches), "load-balancing loss": record(model, batches[::-1]),
             "bias update": record(model, batches, torch.linspace(1, -1, E))}
    steps = list(range(1, 13))
    return steps, loads, explore.expert_load(steps, loads, every=5)


def test_expert_load_shows_the_recorded_shares_at_every_step(load_case):
    steps, loads, e = load_case
    spec = e.spec("en")
    shown = controls(spec)
    assert [label for label, _, _ in shown] == ["1", "5", "10", "12"]
    n_layer = 2
    first_idx = shown[0][2][2]
    for label, method, (bars, lines, idx) in shown:
        i = steps.index(int(label))
        assert method == "update" and idx == first_idx and len(bars["y"]) == n_layer * 3
        for l in range(n_layer):
            for j, key in enumerate(ch08.BALANCING):
                y = np.array(bars["y"][3 * l + j])
                assert y.shape == (E,)
                assert np.allclose(y, loads[key][i, l].numpy() * E, atol=1e-4)
                assert spec["data"][idx[3 * l + j]]["name"] == ch08.BALANCING[key]
            assert lines[f"shapes[{l}].x0"] == lines[f"shapes[{l}].x1"] == int(label)
    # the lower curves: the busiest expert of each layer, at every step
    curves = [t for t in spec["data"] if t["type"] == "scatter" and t.get("hovertemplate", "").startswith("step")]
    assert len(curves) == n_layer * 3
    for c, (l, key) in zip(curves, [(l, k) for l in range(n_layer) for k in ch08.BALANCING]):
        assert c["x"] == steps
        assert np.allclose(c["y"], loads[key][:, l].max(-1).values.numpy() * E, atol=1e-4)
    # the shares sum to an even share times E: what "load / even share" means
    assert np.allclose(np.array(shown[0][2][0]["y"]).sum(-1), E, atol=1e-3)


def test_labels_come_from_the_module_and_the_figures_are_small(capacity_case, load_case):
    for e in (capacity_case[3], load_case[2]):
        spec = e.spec("en")
        assert labels_from_templates(spec, ch08) == [], e.name
        assert spec["layout"]["meta"]["explorer"] == e.name and e.alt and e.hint
    # at the notebook's size: 200 steps of 4 layers, a 32-character passage, 8 capacity factors
    loads = {k: torch.softmax(torch.randn(200, 4, E), -1) for k in ch08.BALANCING}
    big_load = explore.expert_load(range(1, 201), loads)
    routes = {k: (torch.rand(T, K), torch.stack([torch.randperm(E)[:K] for _ in range(T)]),
                  torch.rand(8, T, K) > 0.3) for k in ch08.BALANCING}
    big_cap = explore.capacity(list("x" * T), E, [0.5, 0.75, 1, 1.25, 1.5, 2, 3, 4], [4, 6, 8, 10, 12, 16, 24, 32],
                               routes, layer=0)
    sizes = [len(json.dumps(x.spec("en"))) for x in (big_load, big_cap)]
    assert all(s < 250_000 for s in sizes) and sum(sizes) < 800_000, sizes


def test_no_solution_code_in_the_module():
    source = Path(ch08.__file__).read_text()
    assert "attncourse_ref" not in source and "solution" not in source.lower()
