"""What the explorers' tests (tests/test_explore*.py) read from a figure's Plotly JSON."""
import re
import sys
from pathlib import Path

from attncourse import explore
from attncourse.i18n import PLACEHOLDER, _parses

ROOT = Path(__file__).resolve().parent.parent


def controls(spec):
    """Every slider step and menu button of ``spec``: [(label, method, args)]."""
    out = []
    for control in spec["layout"].get("sliders", []) + spec["layout"].get("updatemenus", []):
        for step in control.get("steps", control.get("buttons", [])):
            out.append((step["label"], step["method"], step["args"]))
    return out


def labels_from_templates(spec, module):
    """The reader-visible strings of ``spec`` with English words that no template of ``module`` produces."""
    sys.path.insert(0, str(ROOT / "tools"))
    import i18n
    templates = [t for t, _ in i18n.message_templates(Path(module.__file__).read_text())]
    literals = [[p.replace("{{", "{").replace("}}", "}") for p in PLACEHOLDER.split(t)] for t in templates]
    return [s for s in explore.strings(spec) if re.search(r"[A-Za-z]{2,}", s)
            and not any(_parses(s, lit) for lit in literals)]
