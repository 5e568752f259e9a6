"""The visible checks' stored cases must match what the reference produces today."""
from importlib import resources

import make_check_data


def test_stored_check_data_is_current():
    for chapter in sorted(make_check_data.builders()):
        stored = resources.files("attncourse.checks").joinpath("data", f"{chapter}.json").read_text()
        assert stored == make_check_data.build(chapter), (
            f"{chapter}.json is stale: run python tools/make_check_data.py {chapter}")
