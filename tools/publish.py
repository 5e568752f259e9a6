"""Write the public tree of the course: python tools/publish.py [--out public]   (what `make publish` runs)

This repository is where the course is developed, with its answers (solutions/, the instructor notebooks in
chapters/, the zoo in tests/).  The repository learners see, that the notebooks' set-up cell installs from and
that the launch buttons open (_config.yml's `repository`), holds none of them.  This writes it:

    README.md, README.zh.md, LICENSE, LICENSE-CONTENT.md   the learners' and instructors' README, the licences
    utils/                                                the learner package (attncourse)
    binder/                                               the recipe Binder builds the environment with
    notebooks/<chapter>/<name>.ipynb                      the student notebooks, as `make release` makes them
    notebooks/zh/<chapter>/<name>.ipynb                   ... and their Chinese edition
    site/                                                 the website in both languages (_build/html: `make site`)

and then refuses it (exit status 1, the tree left for inspection) if anything in it carries an answer: a
solution or hidden-test region's marker, an import of the reference package, a graded reference body of any
chapter (tools/leaks.py, token by token), a file of solutions/, tests/ or chapters/, or a course's grading
salt or gradebook.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_site  # noqa: E402
import leaks  # noqa: E402
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
FILES = ["README.md", "README.zh.md", "LICENSE", "LICENSE-CONTENT.md"]
FOLDERS = ["utils", "binder"]
# Text no public file may hold: the regions nbgrader strips, and the solution regions' imports of the reference.
MARKERS = [nbtools.BEGIN, nbtools.END, "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS", "from attncourse_ref",
           "import attncourse_ref"]
PRIVATE_PARTS = {"solutions", "tests", "chapters", "attncourse_ref", "verdicts", "autograded", "submitted", "salvaged"}
PRIVATE_NAMES = {"grading_salt", "gradebook.db", "grades.csv"}
IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", ".ipynb_checkpoints")


def student_notebooks(out):
    """notebooks/<chapter>/ and notebooks/zh/<chapter>/: each chapter's release, made by nbgrader as `make release`."""
    import i18n
    with tempfile.TemporaryDirectory() as tmp:
        for chapter in nbtools.chapters():
            shutil.copytree(nbtools.CHAPTERS / chapter, Path(tmp) / "chapters" / chapter, ignore=IGNORE)
        # One nbgrader run for every chapter (its assignment id a glob, as for autograde's students): nbgrader
        # starts once, not once per chapter (the student notebooks took 17.5 s so, 5.2 s now).
        res = nbtools.nbgrader("generate_assignment", "*", "--force", root=Path(tmp))
        if res.returncode:
            raise SystemExit(f"nbgrader generate_assignment failed:\n{res.stdout}\n{res.stderr}")
        for chapter in nbtools.chapters():
            released = sorted((Path(tmp) / "release" / chapter).glob("*.ipynb"))
            if not released:
                raise SystemExit(f"{chapter}: nbgrader generate_assignment made no student notebook:\n"
                                 f"{res.stdout}\n{res.stderr}")
            for nb_path in released:
                nb = nbtools.read(nb_path)
                nbtools.write(nb, out / "notebooks" / chapter / nb_path.name)
                nbtools.write(i18n.translate_notebook(nb, chapter), out / "notebooks" / "zh" / chapter / nb_path.name)


def publish(out, html=build_site.HTML):
    out = Path(out)
    if not (Path(html) / "index.html").exists():
        raise SystemExit(f"no built site in {html}: run `make site` first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in FILES:
        shutil.copy(ROOT / name, out / name)
    for name in FOLDERS:
        shutil.copytree(ROOT / name, out / name, ignore=IGNORE)
    student_notebooks(out)
    shutil.copytree(html, out / "site", ignore=IGNORE)
    return out


def answers(out):
    """[(file, what)]: everything in the tree below ``out`` that an answer could be read from."""
    out = Path(out)
    found = []
    for f in sorted(out.rglob("*")):
        rel = f.relative_to(out)
        if PRIVATE_PARTS & set(rel.parts[:-1] if f.is_file() else rel.parts) or f.name in PRIVATE_NAMES:
            found.append((rel, "a private file or folder"))
        elif f.is_file() and f.suffix in leaks.TEXT_SUFFIXES and "mathjax" not in f.parts:
            text = f.read_text(errors="ignore")
            found += [(rel, f"the marker {m!r}") for m in MARKERS if m in text]
    found += [(f.relative_to(out), f"the reference body of {ch}'s {gid}") for f, ch, gid in leaks.scan(out)]
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "public"), help="where to write the public tree (default: public/)")
    args = ap.parse_args(argv)
    out = publish(args.out)
    found = answers(out)
    files = [f for f in out.rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    if found:
        for f, what in found[:20]:
            print(f"ANSWER  {f}: {what}")
        print(f"\n{len(found)} problem(s): {out} must not be published (left there to inspect)")
        return 1
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"public tree in {out}: {len(files):,} files, {size / 2**20:.1f} MiB, no answer found "
          f"(from commit {git.stdout.strip() or 'unknown'}). Publish it as the course's public repository "
          "(main branch: all of it; gh-pages: the contents of site/).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
