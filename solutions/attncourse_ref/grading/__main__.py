"""Serve hidden tests over stdin/stdout (see attncourse.autograde for the client side)."""
import importlib
import pkgutil
import sys

from attncourse import _wire

from . import REGISTRY, compare, seed_for



def load_chapters():
    """Import every chapter module of this package (chNN.py); each registers its hidden tests."""
    from attncourse_ref import grading
    for info in pkgutil.iter_modules(grading.__path__):
        if info.name.startswith("ch"):
            importlib.import_module(f"attncourse_ref.grading.{info.name}")


def main():
    import numpy as np
    import torch

    torch.set_num_threads(1)
    load_chapters()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must not corrupt the pipe
    while True:
        try:
            req, _ = _wire.recv(stdin)
        except EOFError:
            return
        test_id = req["test"]
        if test_id not in REGISTRY:
            _wire.send(stdout, {"error": f"unknown hidden test {test_id!r}"})
            continue
        seed = seed_for(test_id)
        torch.manual_seed(seed)
        cases = REGISTRY[test_id](np.random.default_rng(seed))
        arrays = {f"c{i}/{k}": v for i, c in enumerate(cases) for k, v in c.arrays.items()}
        _wire.send(stdout, {"cases": [c.call for c in cases]}, arrays)
        answer, got = _wire.recv(stdin)
        failures = []
        for i, (case, res) in enumerate(zip(cases, answer["results"])):
            if "error" in res:
                reason = f"your code raised {res['error']}"
            else:
                reason = compare(case, [got[f"c{i}/out{j}"] for j in range(res["n"])])
            if reason:
                failures.append(f"case {i + 1} {case.describe}: {reason}")
        _wire.send(stdout, {"n_cases": len(cases), "failures": failures})


if __name__ == "__main__":
    main()
