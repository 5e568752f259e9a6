"""The visible checks' stored cases must match what the reference produces today.

Floats are compared to 1e-9 relative: the last digit of a float64 result depends on the CPU's BLAS kernels
(an AMD and an Intel machine disagree in the 16th digit), while a stale file differs in far more.
"""
import json
import math
from importlib import resources

import make_check_data


def _same(stored, fresh, where="$"):
    """The first place where two decoded JSON documents differ, or None."""
    if isinstance(stored, float) or isinstance(fresh, float):
        ok = (isinstance(stored, (int, float)) and isinstance(fresh, (int, float))
              and (math.isclose(stored, fresh, rel_tol=1e-9, abs_tol=1e-12)
                   or math.isnan(stored) and math.isnan(fresh)))
        return None if ok else f"{where}: {stored!r} != {fresh!r}"
    if type(stored) is not type(fresh):
        return f"{where}: {type(stored).__name__} != {type(fresh).__name__}"
    if isinstance(stored, dict):
        if stored.keys() != fresh.keys():
            return f"{where}: keys {sorted(stored.keys() ^ fresh.keys())} differ"
        return next((d for k in stored if (d := _same(stored[k], fresh[k], f"{where}.{k}"))), None)
    if isinstance(stored, list):
        if len(stored) != len(fresh):
            return f"{where}: length {len(stored)} != {len(fresh)}"
        return next((d for i, (a, b) in enumerate(zip(stored, fresh)) if (d := _same(a, b, f"{where}[{i}]"))), None)
    return None if stored == fresh else f"{where}: {stored!r} != {fresh!r}"


def test_same_can_fail():
    assert _same({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 + 1e-15]}) is None
    assert _same({"a": [1.0, 2.0]}, {"a": [1.0, 2.001]}) == "$.a[1]: 2.0 != 2.001"
    assert _same([float("nan")], [float("nan")]) is None and _same([float("nan")], [1.0]) is not None
    assert _same({"a": [1.0]}, {"a": [1.0, 2.0]}) is not None
    assert _same({"a": "x"}, {"b": "x"}) is not None


def test_stored_check_data_is_current():
    for chapter in sorted(make_check_data.builders()):
        stored = resources.files("attncourse.checks").joinpath("data", f"{chapter}.json").read_text()
        difference = _same(json.loads(stored), json.loads(make_check_data.build(chapter)))
        assert difference is None, (
            f"{chapter}.json is stale ({difference}): run python tools/make_check_data.py {chapter}")
