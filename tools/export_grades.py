"""Export every grade with per-exercise points: python tools/export_grades.py [--root DIR] [--out grades.csv]

One row per student; for each chapter a total column and one column per graded test cell
(`ch02:test_sdpa_masked`), then the course total.  Missing submissions score 0 and are marked
in the `missing` column.
"""
import argparse
import csv
import sys
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402


def rows(db_url):
    with Gradebook(db_url) as gb:
        assignments = sorted(gb.assignments, key=lambda a: a.name)
        columns = []
        for a in assignments:
            columns.append(f"{a.name}")
            for nb in a.notebooks:
                columns += [f"{a.name}:{c.name}" for c in sorted(nb.grade_cells, key=lambda c: c.name)]
        out = []
        for student in sorted(gb.students, key=lambda s: s.id):
            row, missing, total = {"student_id": student.id}, [], 0.0
            for a in assignments:
                try:
                    sub = gb.find_submission(a.name, student.id)
                except MissingEntry:
                    missing.append(a.name)
                    row[a.name] = 0
                    continue
                row[a.name] = sub.score
                total += sub.score
                for nb in sub.notebooks:
                    for g in nb.grades:
                        row[f"{a.name}:{g.name}"] = g.score
            row["total"], row["missing"] = total, " ".join(missing)
            out.append(row)
        max_row = {"student_id": "(max)", "total": sum(a.max_score for a in assignments), "missing": ""}
        for a in assignments:
            max_row[a.name] = a.max_score
            for nb in a.notebooks:
                for c in nb.grade_cells:
                    max_row[f"{a.name}:{c.name}"] = c.max_score
        return ["student_id", *columns, "total", "missing"], [max_row, *out]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(nbtools.ROOT))
    ap.add_argument("--out", default=None, help="default: <root>/grades.csv")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    url = nbtools.gradebook_url(root)
    if url.startswith("sqlite") and not (root / "gradebook.db").exists():
        raise SystemExit(f"no gradebook at {root / 'gradebook.db'}: run `make autograde CH=...` first")
    header, data = rows(url)
    out = Path(args.out) if args.out else root / "grades.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, restval="")
        w.writeheader()
        w.writerows(data)
    print(f"wrote {len(data) - 1} student(s) to {out}")


if __name__ == "__main__":
    main()
