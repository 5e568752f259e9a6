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

# The suite's fake classes expect the grades of known cases: every grading run here draws them with one salt
# (a real course gets a secret one of its own, tools/grade_class.py course_salt; tested in test_grading.py).
os.environ.setdefault("ATTNCOURSE_GRADING_SALT", "attncourse")

CHAPTERS = nbtools.chapters()

# Each xdist worker, and every process it starts, gets its share of the cores (before torch is imported): two
# workers whose torch each runs an OpenMP thread per core spin against each other (nbtools.share_cores).
nbtools.share_cores(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))


@pytest.fixture(params=CHAPTERS)
def chapter(request):
    return request.param


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same torch RNG state: a failure reproduces, a pass is not luck."""
    import torch
    torch.manual_seed(0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` sends the tests of one `xdist_group` (the site build's) to one worker by a
    suffix on their node ids.  pytest-xdist 3.8 writes that suffix to an attribute pytest 9 no longer
    reads, so the site was built in two workers at once: write it where pytest 9 keeps the id."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and not item.nodeid.endswith("@" + "_".join(groups)):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


# The cost of every test, for `make benchmark` (each chapter's test cost against its budget): collected where
# the reports arrive (the controller under xdist) and written once the session ends.
_DURATIONS = {}
_TIMELINE = {}          # {test: [worker, first start, last stop]}: how well the workers were kept busy


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    span = _TIMELINE.setdefault(report.nodeid, [getattr(worker, "id", "main"), report.start, report.stop])
    span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not _DURATIONS:
        return                                  # a worker: the controller writes the whole run's
    import json
    out = ROOT / "_build" / "test-durations.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"exitstatus": int(exitstatus), "durations": _DURATIONS, "timeline": _TIMELINE}, indent=0))
