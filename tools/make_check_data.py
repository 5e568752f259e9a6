"""Write the visible checks' stored cases (utils/attncourse/checks/data/<chapter>.json) from the reference.

Each chapter's ``check_data()`` lives beside its hidden tests in attncourse_ref/grading/<chapter>.py.

Run after changing a reference implementation:  python tools/make_check_data.py [chapter ...]
tests/test_check_data.py fails when a stored file no longer matches what this script writes.
"""
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "utils" / "attncourse" / "checks" / "data"


def as_list(t):
    if t.dtype == torch.bool:
        return t.tolist()
    return [round(x, 10) for x in t.flatten().tolist()] if t.dim() == 0 else _round(t.tolist())


def _round(x):
    return [_round(i) for i in x] if isinstance(x, list) else round(x, 10)




def encode(obj):
    if isinstance(obj, torch.Tensor):
        return as_list(obj.detach())
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    return obj


def _compact(text):
    """Put each innermost list of numbers on one line: readable diffs, a third of the size."""
    return re.sub(r"\[[^\[\]{}]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)).replace("[ ", "[").replace(" ]", "]"), text)


def builders():
    """{chapter: check_data function} from the grading modules of the reference package."""
    from attncourse_ref import grading
    found = {}
    for info in pkgutil.iter_modules(grading.__path__):
        module = importlib.import_module(f"attncourse_ref.grading.{info.name}")
        if hasattr(module, "check_data"):
            found[info.name] = module.check_data
    return found


def build(chapter):
    with torch.no_grad():
        return _compact(json.dumps(encode(builders()[chapter]()), indent=1)) + "\n"


def main(chapters):
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for ch in chapters or sorted(builders()):
        (DATA_DIR / f"{ch}.json").write_text(build(ch))
        print(f"wrote {DATA_DIR / f'{ch}.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
