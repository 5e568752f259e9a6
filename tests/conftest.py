import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

from hypothesis import settings  # noqa: E402

settings.register_profile("course", deadline=None, max_examples=40, derandomize=True)
settings.load_profile("course")

import nbtools  # noqa: E402

CHAPTERS = nbtools.chapters()


@pytest.fixture(params=CHAPTERS)
def chapter(request):
    return request.param


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same torch RNG state: a failure reproduces, a pass is not luck."""
    import torch
    torch.manual_seed(0)
