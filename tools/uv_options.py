"""uv's options for the package sources pip is configured with here, for `make env`.

uv installs the pinned environment several times faster than pip, but it does not read pip's configuration
(pip.conf, PIP_* variables): on a machine whose packages come from local indexes, a bare ``uv pip install``
would look elsewhere.  This prints, one per line, the options that point uv where pip looks: the index,
the extra indexes, find-links and constraint files (from ``pip config list``, an environment variable over a
file), and pip's own choice among indexes (the best version from any of them).
"""
import re
import subprocess
import sys

# pip's option -> uv's; both take several values separated by white space in pip's configuration.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_config(listing):
    """{option: value} from ``pip config list`` output; a value from the environment (":env:") wins."""
    found = {}
    for line in listing.splitlines():
        m = re.match(r"^([^.]*)\.([\w-]+)='(.*)'$", line.strip())
        if m and m.group(2) in OPTIONS and (m.group(1) == ":env:" or m.group(2) not in found):
            found[m.group(2)] = m.group(3)
    return found


def uv_options(config):
    options = ["--index-strategy", "unsafe-best-match"]
    for name, value in config.items():
        for item in value.split():
            options += [OPTIONS[name], item]
    return options


def main():
    res = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    print("\n".join(uv_options(pip_config(res.stdout if res.returncode == 0 else ""))))


if __name__ == "__main__":
    main()
