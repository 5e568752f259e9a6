"""The instructors' bundle: the grading materials the public tree leaves out, for adopting instructors only.

    python tools/bundle.py build  [--public public] [--out dist] [--recipients instructors.txt]   (make bundle)
    python tools/bundle.py verify [--public .]       (run in a public tree the bundle was unpacked into)

The public tree (tools/publish.py) holds what learners need and no answer.  An instructor who adopts the course
also needs what grades: the reference package with the grading server (solutions/), the instructor notebooks
(chapters/, whose solution and hidden-test regions nbgrader strips), the mistake zoo (tests/zoo/), the tools and
the Makefile that run them.  ``build`` writes them to dist/attncourse-instructors-<version>.tar.gz with a
MANIFEST.json: the SHA-256 of every file in the bundle and of every file of the public tree it was built beside
(site excepted), so an instructor can check that the two are one version of the course.  With ``--recipients``
(age public keys, one per line) the archive is encrypted to those instructors with age (https://age-encryption.org,
Debian's package ``age``) and only the .age file is written: it can be handed out anywhere, only they can open it.

Unpacked into a clone of the public tree, the two make a course folder where `make env`, `make release`,
`make autograde`, `make feedback` and `make grades` work as in this repository (tests/test_site.py grades a class
there, from the two trees alone).
"""
import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
FILES = ["Makefile", "nbgrader_config.py", "requirements.txt"]
FOLDERS = ["solutions", "chapters", "tools", "tests/zoo"]
SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints"}
SKIP_SUFFIXES = (".pyc", ".egg-info")


def _files(base, names):
    """Files under ``base`` named by ``names`` (files or folders), as sorted relative paths."""
    out = []
    for name in names:
        path = base / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in found:
            rel = f.relative_to(base)
            if not (SKIP_PARTS & set(rel.parts) or any(part.endswith(SKIP_SUFFIXES) for part in rel.parts)):
                out.append(rel)
    return sorted(out)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def public_files(public):
    """The public tree's files an instructor's copy must match (the built site aside: it is rebuilt often)."""
    public = Path(public)
    return [p for p in _files(public, [p.name for p in sorted(public.iterdir())])
            if p.parts[0] != "site" and p.name != "MANIFEST.json"]


def version():
    res = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else "unversioned"


def build(public, out, recipients=None):
    """Write the bundle beside the public tree ``public``; return the archive's path."""
    public, out = Path(public), Path(out)
    if not (public / "utils" / "attncourse").is_dir() or not (public / "notebooks").is_dir():
        raise SystemExit(f"no public tree in {public}: run `make publish` first")
    files = _files(ROOT, FILES + FOLDERS)
    manifest = {"version": version(),
                "bundle": {str(p): sha256(ROOT / p) for p in files},
                "public": {str(p): sha256(public / p) for p in public_files(public)}}
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"attncourse-instructors-{manifest['version']}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in files:
            tar.add(ROOT / p, arcname=str(p))
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo("MANIFEST.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    if recipients:
        if shutil.which("age") is None:
            archive.unlink()
            raise SystemExit("--recipients needs age (Debian: apt-get install age; https://age-encryption.org)")
        sealed = archive.with_name(archive.name + ".age")
        res = subprocess.run(["age", "--encrypt", "--recipients-file", str(recipients), "--output", str(sealed),
                              str(archive)], capture_output=True, text=True)
        archive.unlink()           # never leave the clear archive beside the sealed one
        if res.returncode:
            raise SystemExit(f"age could not encrypt the bundle: {res.stderr.strip()}")
        archive = sealed
    return archive


def verify(public):
    """[(file, problem)] where the bundle unpacked in ``public`` or the public tree differs from the manifest."""
    public = Path(public)
    manifest = json.loads((public / "MANIFEST.json").read_text())
    problems = []
    for part in ("bundle", "public"):
        for rel, digest in manifest[part].items():
            path = public / rel
            if not path.is_file():
                problems.append((rel, "missing"))
            elif sha256(path) != digest:
                problems.append((rel, "differs from the version the bundle was built with"))
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the bundle (after make publish)")
    b.add_argument("--public", default=str(ROOT / "public"), help="the public tree (default: public/)")
    b.add_argument("--out", default=str(ROOT / "dist"), help="folder for the archive (default: dist/)")
    b.add_argument("--recipients", help="age public keys, one per line: write only the encrypted archive")
    v = sub.add_parser("verify", help="check an unpacked bundle and its public tree against the manifest")
    v.add_argument("--public", default=str(ROOT), help="the public tree the bundle was unpacked into (default: .)")
    args = ap.parse_args(argv)
    if args.command == "build":
        archive = build(args.public, args.out, args.recipients)
        print(f"{archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
        return 0
    problems = verify(args.public)
    for rel, what in problems:
        print(f"{rel}: {what}")
    manifest = json.loads((Path(args.public) / "MANIFEST.json").read_text())
    if problems:
        print(f"{len(problems)} file(s) differ from course version {manifest['version']}")
        return 1
    print(f"course version {manifest['version']}: the bundle's {len(manifest['bundle'])} files and the public "
          f"tree's {len(manifest['public'])} match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
