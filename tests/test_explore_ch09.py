"""Chapter 09's explorers: the numbers each shows are the chapter's (lr_at's schedules, training_memory's
bytes, the runs' logged losses), every state has the first state's shape, every label comes from a template
of the module (so the catalogue can translate it), and the figures are small."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from attncourse import explore
from attncourse.explore import ch09
from attncourse_ref.training import lr_at, training_memory

from explore_helpers import controls, labels_from_templates


STEPS = list(range(1200))           # 9.2's plot


@pytest.fixture(scope="module")
def lr_case():
    schedules = {k: [lr_at(s, **args) for s in STEPS] for k, (_, args) in ch09.LR_SCHEDULES.items()}
    return schedules, explore.lr_schedule(STEPS, schedules)


def test_lr_schedule_shows_lr_at_for_every_setting(lr_case):
    schedules, e = lr_case
    spec = e.spec("en")
    buttons = controls(spec)
    assert [label for label, _, _ in buttons] == [label for label, _ in ch09.LR_SCHEDULES.values()]
    reference, chosen = spec["data"][0], spec["data"][1]
    grid = reference["x"]
    assert grid[:25] == list(range(25)) and grid[-1] == 1199 and all(s % 5 == 0 for s in grid[25:-1])
    assert np.allclose(reference["y"], [schedules["section"][s] for s in grid], rtol=1e-4, atol=1e-9)
    first = buttons[0][2]
    for (label, method, (update, idx)), (key, (_, args)) in zip(buttons, ch09.LR_SCHEDULES.items()):
        assert method == "restyle" and idx == first[1] == [1, 2] and set(update) == {"x", "y"}
        assert update["x"][0] == grid and len(update["y"][0]) == len(grid)
        assert np.allclose(update["y"][0], [schedules[key][s] for s in grid], rtol=1e-4, atol=1e-9), key
        # the markers: the end of the warmup and the end of the decay, where they are inside the run
        ends = [s for s in (args["warmup_steps"], args["max_steps"]) if s < len(STEPS)]
        assert update["x"][1] == ends
        assert np.allclose(update["y"][1], [lr_at(s, **args) for s in ends], rtol=1e-4, atol=1e-9)
    # what the explorer is for: step 0 gets max_lr / warmup; without warmup the full rate
    assert math.isclose(buttons[0][2][0]["y"][0][0], 6e-4 / 100, rel_tol=1e-4)
    no_warmup = list(ch09.LR_SCHEDULES).index("no_warmup")
    assert math.isclose(buttons[no_warmup][2][0]["y"][0][0], 6e-4, rel_tol=1e-4)
    assert chosen["y"] == buttons[0][2][0]["y"][0]


SHAPES = [dict(n_params=124_475_904, n_layer=12, n_embd=768, n_head=12),
          dict(n_params=6_738_415_616, n_layer=32, n_embd=4096, n_head=32)]
SEQ_LENS = [256, 512, 1024, 2048, 4096, 8192]


@pytest.fixture(scope="module")
def memory_case():
    results = [{k: [training_memory(**shape, batch=1, seq_len=s, **args) for s in SEQ_LENS]
                for k, (_, args) in ch09.MEMORY_SETUPS.items()} for shape in SHAPES]
    return results, explore.memory(SHAPES, SEQ_LENS, results)


def test_memory_shows_training_memory_part_by_part(memory_case):
    results, e = memory_case
    spec = e.spec("en")
    steps = controls(spec)
    assert [label for label, _, _ in steps] == [f"{s:,}" for s in SEQ_LENS]
    assert spec["layout"]["sliders"][0]["active"] == SEQ_LENS.index(1024)
    parts = ["weights", "grads", "optimizer", "master", "activations"]
    keys = list(ch09.MEMORY_SETUPS)
    first = steps[0][2]
    annotations = spec["layout"]["annotations"]
    for i, (label, method, (update, labels, idx)) in enumerate(steps):
        assert method == "update" and idx == first[2] and len(update["y"]) == len(idx) == 2 * len(parts)
        assert len(labels) == len(first[1]) == 2 * 2 * len(keys)        # each stack's total: its text and height
        for m in range(len(SHAPES)):
            block = update["y"][m * 5:(m + 1) * 5]
            for j, p in enumerate(parts):
                assert np.allclose(block[j], [results[m][k][i][p] / 2 ** 30 for k in keys], atol=1e-4), (m, p)
                assert spec["data"][idx[m * 5 + j]]["type"] == "bar"
                assert spec["data"][idx[m * 5 + j]]["xaxis"] == ("x" if m == 0 else "x2")
            totals = [results[m][k][i]["total"] / 2 ** 30 for k in keys]
            shown = [(a, labels[f"annotations[{a}].y"]) for a in range(len(annotations))
                     if f"annotations[{a}].y" in labels and annotations[a]["yref"] == ("y" if m == 0 else "y2")]
            assert [a["x"] for a in (annotations[j] for j, _ in shown)] == list(range(len(keys)))
            assert np.allclose([y for _, y in shown], totals, atol=1e-4)
            assert [labels[f"annotations[{j}].text"] for j, _ in shown] == [f"{t:.1f}" for t in np.round(totals, 4)]
            assert np.allclose(np.sum(block, axis=0), totals, atol=1e-3)      # the stack adds up to the total
    # the 80 GB line: drawn for the 7B model, whose model state alone exceeds it, not for GPT-2 small
    lines = spec["layout"]["shapes"]
    assert len(lines) == 1 and lines[0]["yref"] == "y2" and math.isclose(lines[0]["y0"], 80e9 / 2 ** 30, rel_tol=1e-9)
    assert "one 80 GB GPU" in [a["text"] for a in spec["layout"]["annotations"]]
    # mixed precision changes the parts of the model state, not its 16 bytes per parameter
    mixed = steps[0][2][0]["y"]
    state = [sum(mixed[5 + j][keys.index(k)] for j in range(4)) for k in ("fp32", "mixed")]
    assert np.allclose(state, 16 * SHAPES[1]["n_params"] / 2 ** 30, rtol=1e-5)


def curve(n, offset=0.0, start=1):
    steps = list(range(start, start + n))
    return steps, [3.0 * math.exp(-s / 15) + 1.5 + offset for s in steps]


@pytest.fixture(scope="module")
def runs_case():
    curves = {"cpu": curve(40), "cpu_val": ([0, 20, 40], [4.2, 2.6, 2.1]), "adamw-torch": curve(60),
              "adamw-mine": curve(60, 3e-6), "once": curve(20), "resumed": curve(20), "one": curve(8),
              "two": (curve(8)[0], [v + (2e-6 if i == 3 else 0.0) for i, v in enumerate(curve(8)[1])])}
    widths = {w: (1000 * w, [0, 25, 50], [4.2, 3.0 - w / 1000, 2.5 - w / 1000]) for w in (32, 64, 128, 192)}
    return curves, widths, explore.lab_runs(curves, widths)


def test_lab_runs_shows_each_comparison_with_its_largest_difference(runs_case):
    curves, widths, e = runs_case
    spec = e.spec("en")
    names = {t["name"]: t for t in spec["data"]}
    for key, (name, _) in ch09.LAB_RUNS.items():
        assert names[name]["x"] == curves[key][0] and np.allclose(names[name]["y"], curves[key][1], atol=1e-4)
    for w, (n, steps, losses) in widths.items():
        t = names[f"width {w}: {n / 1e6:.2f}M parameters"]
        assert t["x"] == steps and np.allclose(t["y"], losses, atol=1e-4)
    buttons = controls(spec)
    assert [label for label, _, _ in buttons] == [
        "9.7: the CPU mode", "9.7: your AdamW against PyTorch's (largest difference 3.0e-06)",
        "9.8: stopped and resumed against uninterrupted (largest difference 0.0e+00)",
        "9.9: two processes against one (largest difference 2.0e-06)", "9.12: four widths, the same tokens"]
    groups = [["training loss", "validation loss"], ["PyTorch's AdamW", "your AdamW"],
              ["uninterrupted run", "stopped, then resumed"],
              ["one process, the whole batch", "two processes, half the batch each"],
              [f"width {w}: {n / 1e6:.2f}M parameters" for w, (n, _, _) in widths.items()]]
    for (label, method, (update,)), group in zip(buttons, groups):
        assert method == "restyle" and len(update["visible"]) == len(spec["data"])
        assert [t["name"] for t, v in zip(spec["data"], update["visible"]) if v] == group
    assert [t.get("visible") for t in spec["data"]] == buttons[0][2][0]["visible"]     # opens at the first


def test_labels_come_from_the_module_and_the_figures_are_small(lr_case, memory_case, runs_case):
    sizes = []
    for e in (lr_case[1], memory_case[1], runs_case[2]):
        spec = e.spec("en")
        assert labels_from_templates(spec, ch09) == [], e.name
        assert spec["layout"]["meta"]["explorer"] == e.name and e.alt and e.hint
        sizes.append(len(json.dumps(spec)))
    assert all(s < 250_000 for s in sizes) and sum(sizes) < 800_000, sizes


def test_no_solution_code_in_the_module():
    source = Path(ch09.__file__).read_text()
    assert "attncourse_ref" not in source and "solution" not in source.lower()
