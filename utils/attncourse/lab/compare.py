"""The lab's CPU mode against the classic minimal-GPT CPU recipe, in the same wall time.

    python -m attncourse.lab.compare [--seconds 40] [--repeats 2] [--code mylab.py | --model fallback]

All runs use the same training program, corpus, validation batches and model class; only the
recipe differs.  The CPU mode fits its cosine schedule to the time; the minimal recipe (4
layers, 4 heads, width 128, context 64, batch 12, learning rate 1e-3 decaying over 2,000
steps) runs as published until the time is up.  A third run gives the minimal recipe's model a
schedule fitted to the time (its warmup, like the CPU mode's, a tenth of the steps that fit), and a
fourth also the CPU mode's learning rate: one change at a time separates what the schedule, the
learning rate and the model's depth each buy.

The four train *at the same time*, one process and one thread each, for --seconds: whatever
else the machine is doing slows them alike, so the comparison holds on a busy machine too.
--repeats rounds are averaged.  The table goes to stdout and, as JSON, to --out (default: the
copy shipped with the course, which the chapter 09 page shows).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .train import PRESETS

RESULTS = Path(__file__).with_name("results")


RECIPES = [
    # (name, preset, what differs from the preset)
    ("this lab's CPU mode (--preset cpu)", "cpu", {}),
    ("classic minimal-GPT recipe (--preset minimal)", "minimal", {}),
    ("minimal recipe's model, schedule fitted to the time", "minimal", {"max_steps": 0}),
    ("... and the CPU mode's learning rate", "minimal", {"max_steps": 0, "lr": 2e-3, "min_lr": 2e-4}),
]


def recipes(seconds, flags, work, repeats=1):
    """Train the recipes side by side for ``seconds``, ``repeats`` rounds; one row per recipe (means)."""
    runs = {name: [] for name, _, _ in RECIPES}
    for r in range(repeats):
        procs = []
        for i, (name, preset, changes) in enumerate(RECIPES):
            out = Path(work) / f"{r}-{i}"
            extra = [str(x) for k, v in changes.items() for x in ("--" + k.replace("_", "-"), v)]
            cmd = [sys.executable, "-m", "attncourse.lab.train", "--preset", preset, *extra, *flags,
                   "--time-budget", str(seconds), "--out-dir", str(out)]
            procs.append((name, out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                      text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))))
        for name, out, proc in procs:
            _, err = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"{name} failed:\n{err}")
            runs[name].append(json.loads((out / "summary.json").read_text()))
    rows = []
    for (name, preset, changes), results in zip(RECIPES, runs.values()):
        cfg = {**PRESETS[preset], **changes}
        mean = lambda key: sum(s[key] for s in results) / len(results)      # noqa: E731
        rows.append({"recipe": name, "model": f"{cfg['n_layer']} layers x {cfg['n_embd']}, {cfg['n_head']} heads",
                     "context": cfg["block_size"], "batch": cfg["batch_size"], "lr": cfg["lr"],
                     "warmup": round(mean("warmup_steps")), "params": results[0]["n_params"],
                     "flops_per_token": results[0]["flops_per_token"],
                     "runs": len(results), "steps": round(mean("steps")),
                     "seconds": round(mean("elapsed_s"), 1), "tokens_per_s": round(mean("mean_tokens_per_s")),
                     "val_loss": round(mean("val_loss"), 4), "val_losses": [round(s["val_loss"], 4) for s in results]})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m attncourse.lab.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--repeats", type=int, default=2, help="runs per recipe, in alternating order")
    p.add_argument("--code", default="mylab.py")
    p.add_argument("--model", default="mine", choices=["mine", "fallback"])
    p.add_argument("--out", default=str(RESULTS / "recipes.json"))
    a = p.parse_args(argv)
    flags = ["--code", a.code, "--model", a.model, "--threads", "1", "--quiet", "--sample-tokens", "0",
             "--eval-interval", str(10 ** 9), "--eval-batches", "40", "--log-interval", "50"]
    start, load = time.time(), os.getloadavg()[0]
    rows = recipes(a.seconds, flags, tempfile.mkdtemp(prefix="attncourse-compare-"), a.repeats)
    result = {"command": "python -m attncourse.lab.compare " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {load:.1f} at the start, "
                         f"torch {torch.__version__}; the recipes train side by side, 1 thread each",
              "eval": "validation loss over the same 40 batches of held-out text, nats per character",
              "rows": rows, "total_s": round(time.time() - start, 1)}
    print(format_table(result))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


def format_table(result):
    lines = [f"{'recipe':<52} {'model':<22} {'T':>3} {'B':>3} {'lr':>6} {'warmup':>6} {'params':>7} {'MFLOP/tok':>9} "
             f"{'steps':>6} {'seconds':>7} {'tokens/s':>9} {'val loss':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['recipe']:<52} {r['model']:<22} {r['context']:>3} {r['batch']:>3} {r['lr']:>6.0e} "
                     f"{r.get('warmup', 100):>6} {r['params'] / 1e6:6.2f}M {r['flops_per_token'] / 1e6:>9.2f} {r['steps']:>6} "
                     f"{r['seconds']:>7.1f} {r['tokens_per_s']:>9,} {r['val_loss']:>8.4f}")
    return "\n".join(lines)


def load(name="recipes"):
    """The stored result of a comparison run (shipped with the course), as a dict."""
    return json.loads((RESULTS / f"{name}.json").read_text())


if __name__ == "__main__":
    main()
