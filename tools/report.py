"""What the class got wrong: python tools/report.py [CHAPTER ...] --root DIR [--anonymous]   (make report)

After grading, one self-contained HTML page per chapter (and an index) under ``reports/``, in the instructor's
language (ATTNCOURSE_LANGUAGE=zh for Chinese): per graded test cell, the points, the share with full marks and
the share not attempted; the mistakes the class made, each with its count, share and students (linked to their
feedback pages); and item analysis (difficulty, and discrimination: the correlation of the cell's score with the
rest of the chapter's).  ``diagnoses.csv`` beside ``grades.csv``: one row per lost test cell, with a mistake id
that is the same in every run and language (the zoo variant's name).  ``--anonymous`` writes
``reports-anonymous/`` instead, with counts and no student named.

How a mistake is diagnosed, outside the student's kernel as grades are: the grading server keeps what a failed
hidden test's code returned (``verdicts/<chapter>/<student>.outputs/``, out of every kernel's reach).  This tool
runs each known mistake of the exercise (the zoo, tests/zoo/) on the same cases, drawn with the course's salt,
and names the mistake whose outputs the student's match on every case (within the tolerance of the outputs'
dtype); failing that, the one whose hidden-test failures read exactly alike.  Its message is what the visible
check says of that mistake.  What matches no known mistake is "not diagnosed", shown with its first failing
case; a test cell lost without a failed hidden test (its visible check, a forbidden call, a review hold) is
counted apart.
"""
import argparse
import base64
import contextlib
import csv
import html
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import confinement  # noqa: E402
import fakeclass  # noqa: E402
import nbtools  # noqa: E402

NOT_ATTEMPTED, NOT_DIAGNOSED, NO_FAILED_TEST = "(not attempted)", "(not diagnosed)", "(lost in the test cell)"
POOR_DISCRIMINATION = 0.2


def first_verdicts(root, chapter, student):
    """{hidden test id: the first verdict of this run} from the server's record (the one that stands)."""
    path = Path(root) / "verdicts" / chapter / f"{student}.jsonl"
    found = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        entry = json.loads(line)
        if "failures" in entry:
            found.setdefault(entry["test"], entry)
    return found


def kept_outputs(path):
    """(per-case results, {c<i>/out<j>: array}) of a failed verdict, as the grading server kept them."""
    with np.load(path, allow_pickle=False) as z:
        return json.loads(z["__results__"].tobytes().decode()), {k: z[k] for k in z.files if k != "__results__"}


def same_outputs(a, b):
    """Whether two codes' kept outputs agree on every case: the same exceptions, shapes, dtypes, and values within
    the tolerance the grading server compares a dtype with."""
    from attncourse_ref.grading import tolerance
    (ra, xa), (rb, xb) = a, b
    if len(ra) != len(rb):
        return False
    for i, (p, q) in enumerate(zip(ra, rb)):
        if ("error" in p) != ("error" in q):
            return False
        if "error" in p:
            if p["error"].split(":")[0] != q["error"].split(":")[0]:
                return False
            continue
        if int(p.get("n", 0)) != int(q.get("n", 0)):
            return False
        for j in range(int(p.get("n", 0))):
            g, e = xa.get(f"c{i}/out{j}"), xb.get(f"c{i}/out{j}")
            if g is None or e is None or g.shape != e.shape or g.dtype != e.dtype:
                return False
            if g.dtype.kind in "fc":
                rtol, atol = tolerance(g.dtype)
                if not (np.array_equal(np.isnan(g), np.isnan(e))
                        and np.allclose(np.nan_to_num(g), np.nan_to_num(e), rtol=rtol, atol=atol)):
                    return False
            elif not np.array_equal(g, e):
                return False
    return True


class Zoo:
    """The chapter's known mistakes, run on the course's cases once per hidden test (in this process, with a
    grading server of its own that keeps every failed verdict's outputs)."""

    def __init__(self, chapter, source, keep):
        self.chapter, self.keep, self.runs, self.messages = chapter, Path(keep), {}, {}
        own = fakeclass.cells_tested(source)
        self.by_cell = {}
        for v in fakeclass.zoo(chapter):
            for t in sorted(set(own.get(v.cell, ())) & v.fails):
                self.by_cell.setdefault(t, []).append(v)

    def outputs(self, cell, test_id):
        """[(variant, its failures, its kept outputs or None)] for the test cell's own mistakes."""
        from attncourse.autograde import run_hidden_test
        if cell not in self.runs:
            self.runs[cell] = []
            for k, v in enumerate(self.by_cell.get(cell, ())):
                with contextlib.redirect_stdout(io.StringIO()):
                    failures = run_hidden_test(test_id, fakeclass.candidate_for(self.chapter, v))["failures"]
                kept = self.keep / f"{test_id}.npz"
                out = None
                if kept.exists():
                    out = kept_outputs(kept)
                    kept.unlink()
                self.runs[cell].append((v, failures, out))
        return self.runs[cell]

    def message(self, variant, language):
        """What the visible check says of this mistake, in ``language`` (its name where the check says nothing)."""
        from attncourse.checks import CheckFailed
        from attncourse import i18n
        if (variant.name, language) not in self.messages:
            checks = __import__(f"attncourse.checks.{self.chapter}", fromlist=["_"])
            said, speaking = variant.name, i18n.language()
            i18n.set_language(language)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    getattr(checks, variant.check)(fakeclass.candidate_for(self.chapter, variant))
            except CheckFailed as err:
                said = str(err)
            except Exception:
                pass
            finally:
                i18n.set_language(speaking)
            self.messages[variant.name, language] = said
        return self.messages[variant.name, language]


def diagnose(zoo, cell, test_id, verdict, kept):
    """(mistake id, [variants]) of one failed verdict."""
    failures = verdict["failures"]
    if failures and all("raised NotImplementedError" in f for f in failures):
        return NOT_ATTEMPTED, []
    runs = zoo.outputs(cell, test_id)
    found = [v for v, _, out in runs if kept is not None and out is not None and same_outputs(kept, out)]
    found = found or [v for v, said, _ in runs if said == failures]
    if not found:
        return NOT_DIAGNOSED, []
    return " | ".join(v.name for v in found), found


def chapter_data(chapter, root, zoo_keep):
    """Everything the chapter's page shows: students, cells, scores and one diagnosis per lost cell."""
    from nbgrader.api import Gradebook, MissingEntry
    name = nbtools.chapter_notebook(chapter).name
    source = nbtools.read(Path(root) / "chapters" / chapter / name)
    points, hidden = nbtools.points(source), confinement.hidden_ids(source)
    zoo = Zoo(chapter, source, zoo_keep)
    scores = {}
    with Gradebook(nbtools.gradebook_url(root)) as gb:
        try:
            submissions = gb.find_assignment(chapter).submissions
        except MissingEntry:
            submissions = []
        for sub in submissions:
            grades = {g.name: g.score for nb in sub.notebooks for g in nb.grades}
            if grades:
                scores[sub.student.id] = {c: float(grades.get(c) or 0) for c in points}
    rows = []
    for student in sorted(scores):
        verdicts = first_verdicts(root, chapter, student)
        for cell, most in points.items():
            if scores[student][cell] >= most:
                continue
            test_id = hidden.get(cell)
            verdict = verdicts.get(test_id)
            first, variants = "", []
            if verdict is None or not verdict["failures"]:
                mistake = NO_FAILED_TEST
            else:
                path = Path(root) / "verdicts" / chapter / f"{student}.outputs" / f"{test_id}.npz"
                mistake, variants = diagnose(zoo, cell, test_id, verdict, kept_outputs(path) if path.exists() else None)
                first = verdict["failures"][0]
            rows.append({"student": student, "cell": cell, "points": scores[student][cell], "mistake": mistake,
                         "variants": variants, "first": first})
    return {"chapter": chapter, "notebook": name, "points": points, "scores": scores, "rows": rows, "zoo": zoo,
            "root": Path(root)}


def item_analysis(data):
    """{cell: (difficulty = mean share of its points, discrimination = correlation with the rest, or None)}."""
    students = sorted(data["scores"])
    found = {}
    for cell, most in data["points"].items():
        item = [data["scores"][s][cell] for s in students]
        rest = [sum(data["scores"][s].values()) - data["scores"][s][cell] for s in students]
        difficulty = statistics.fmean(item) / most if students and most else None
        try:
            discrimination = statistics.correlation(item, rest)
        except (statistics.StatisticsError, ValueError):     # fewer than two students, or no spread
            discrimination = None
        found[cell] = (difficulty, discrimination)
    return found


def _figure(draw, language, counts, height=2.6):
    """A PNG (base64) drawn by ``draw(ax)``, with a CJK font where the labels are Chinese; the ``counts`` axis ("x" or
    "y") on whole numbers."""
    from matplotlib.ticker import MaxNLocator
    from matplotlib.figure import Figure
    from attncourse.lab.train import _cjk_font
    font = _cjk_font() if language == "zh" else None
    import matplotlib
    with matplotlib.rc_context({"font.family": [font, "sans-serif"]} if font else {}):
        fig = Figure(figsize=(6.4, height), dpi=100)
        ax = fig.add_subplot()
        draw(ax)
        getattr(ax, f"{counts}axis").set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


def _img(png, alt):
    return f'<img src="data:image/png;base64,{png}" alt="{html.escape(alt)}">'


CSS = """body{font-family:system-ui,'Noto Sans CJK SC',sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#222;background:#fff}table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border:1px solid #ccc;padding:.25rem
.5rem;text-align:left;vertical-align:top}th{background:#f2f2f2}.flag{color:#a00;font-weight:bold}.small{color:#555;
font-size:.9em}code,pre{white-space:pre-wrap}"""


def render(data, anonymous, out):
    """The chapter's page, in the language attncourse.i18n speaks now."""
    from attncourse.i18n import language, translate
    lang = language()
    chapter, points, scores, rows = data["chapter"], data["points"], data["scores"], data["rows"]
    n, total = len(scores), sum(points.values())
    e = html.escape
    mean = statistics.fmean(sum(s.values()) for s in scores.values()) if n else 0.0
    title = translate(f"What the class got wrong: {chapter}")
    summary = translate(f"{n} graded submissions; mean score {mean:.1f} of {total:g}.")
    parts = [f"<h1>{e(title)}</h1>", f"<p>{e(summary)}</p>"]
    if n:
        totals = [sum(s.values()) for s in scores.values()]
        score_label, count_label = translate("chapter score"), translate("number of students")
        parts.append(_img(_figure(lambda ax: (ax.hist(totals, bins=np.arange(0, total + 2) - 0.5, color="#4c72b0"),
                                              ax.set_xlabel(score_label), ax.set_ylabel(count_label)), lang, "y"),
                          translate(f"histogram of the scores out of {total:g}")))
    analysis = item_analysis(data)
    head = [translate("test cell"), translate("max points"), translate("difficulty (mean share)"), translate("full marks"),
            translate("not attempted"), translate("discrimination (correlation)")]
    heading = translate("Item analysis")
    parts.append(f"<h2>{e(heading)}</h2><table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>")
    for cell, most in points.items():
        difficulty, disc = analysis[cell]
        full = sum(s[cell] >= most for s in scores.values())
        blank = sum(r["cell"] == cell and r["mistake"] == NOT_ATTEMPTED for r in rows)
        flag = disc is not None and disc < POOR_DISCRIMINATION
        poor = translate("(discriminates poorly)")
        disc_text = "—" if disc is None else f"{disc:.2f}" + (" " + poor if flag else "")
        parts.append(f"<tr><td><code>{e(cell)}</code></td><td>{most:g}</td>"
                     f"<td>{'—' if difficulty is None else f'{difficulty:.0%}'}</td><td>{full / n if n else 0:.0%}</td>"
                     f"<td>{blank / n if n else 0:.0%}</td><td{' class=flag' if flag else ''}>{e(disc_text)}</td></tr>")
    parts.append("</table><p class=small>" + e(translate(
        f"Discrimination is the correlation of a cell's score with the rest of the chapter's; below "
        f"{POOR_DISCRIMINATION:g} the cell tells strong and weak submissions apart poorly (or everyone got it right).")) + "</p>")
    heading = translate("Mistakes, per test cell")
    parts.append(f"<h2>{e(heading)}</h2>")
    for cell, most in points.items():
        lost = [r for r in rows if r["cell"] == cell]
        if not lost:
            continue
        groups = {}
        for r in lost:
            groups.setdefault(r["mistake"], []).append(r)
        order = sorted(groups, key=lambda m: (-len(groups[m]), m))
        parts.append(f"<h3><code>{e(cell)}</code> ({most:g})</h3>")
        labels = [_label(m) for m in order]
        counts = [len(groups[m]) for m in order]
        parts.append(_img(_figure(lambda ax: (ax.barh(range(len(order))[::-1], counts, color="#c44e52"),
                                              ax.set_yticks(range(len(order))[::-1], [lb[:48] for lb in labels]),
                                              ax.set_xlabel(translate("number of students"))), lang, "x",
                                  0.8 + 0.28 * len(order)),
                          translate(f"one bar per mistake in {cell}")))
        head = [translate("mistake id"), translate("what the visible check says"), translate("number of students"),
                translate("share of class")]
        if not anonymous:
            head.append(translate("the students"))
        parts.append(f"<table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>")
        for m in order:
            members = groups[m]
            said = "; ".join(data["zoo"].message(v, lang) for v in members[0]["variants"])
            if m == NOT_DIAGNOSED and not anonymous:
                said = translate("matches no known mistake; first failing case of each:")
            who = ""
            if not anonymous:
                who = "<br>".join(_who(r, data, m == NOT_DIAGNOSED) for r in members)
            cells = [f"<code>{e(_label(m))}</code>", f"<pre>{e(said)}</pre>", str(len(members)), f"{len(members) / n:.0%}"]
            parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + (f"<td>{who}</td>" if not anonymous else "")
                         + "</tr>")
        parts.append("</table>")
    page = (f'<!DOCTYPE html><html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">'
            f"<title>{e(title)}</title><style>{CSS}</style></head><body>{''.join(parts)}</body></html>")
    (out / f"{chapter}.html").write_text(page, encoding="utf-8")


def _label(mistake):
    from attncourse.i18n import translate
    return {NOT_ATTEMPTED: translate("not attempted (the stub still raises)"), NOT_DIAGNOSED: translate("not diagnosed"),
            NO_FAILED_TEST: translate("lost in the test cell (visible check, forbidden call or review hold)")
            }.get(mistake, mistake)


def _who(row, data, with_case):
    from attncourse.i18n import translate
    e = html.escape
    page = Path("feedback") / row["student"] / data["chapter"] / data["notebook"].replace(".ipynb", ".html")
    name = e(row["student"])
    if (data["root"] / page).exists():            # make feedback writes them
        name = f'<a href="{e((".." / page).as_posix())}">{name}</a>'
    return name + (f" <span class=small>{e(translate(row['first']))}</span>" if with_case and row["first"] else "")


def write_diagnoses(path, chapters_data, anonymous):
    """diagnoses.csv: the rows of the chapters reported now, those of other chapters kept."""
    fields = ([] if anonymous else ["student"]) + ["chapter", "exercise", "points", "mistake id", "message"]
    done = {d["chapter"] for d in chapters_data}
    rows = [r for r in csv.DictReader(open(path, encoding="utf-8"))] if path.exists() and not anonymous else []
    rows = [r for r in rows if r.get("chapter") not in done]
    for d in chapters_data:
        for r in d["rows"]:
            message = "; ".join(d["zoo"].message(v, "en") for v in r["variants"]) or (r["first"] or "")
            row = {"chapter": d["chapter"], "exercise": r["cell"], "points": f"{r['points']:g}",
                   "mistake id": r["mistake"], "message": message}
            rows.append(row if anonymous else {"student": r["student"], **row})
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("chapters", nargs="*", help="default: every chapter with graded submissions")
    ap.add_argument("--root", default=".")
    ap.add_argument("--anonymous", action="store_true", help="no student named: reports-anonymous/")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    chapters = args.chapters
    if not chapters and (root / "verdicts").exists():
        chapters = sorted(p.name for p in (root / "verdicts").iterdir() if p.is_dir())
    if not chapters:
        raise SystemExit(f"nothing graded under {root} (no verdicts/): run make autograde first")
    for chapter in chapters:
        if not (root / "verdicts" / chapter).is_dir() or not (root / "chapters" / chapter).is_dir():
            raise SystemExit(f"{chapter} has not been graded under {root}: run make autograde CH={chapter} first")
    from attncourse.i18n import language, translate
    # The zoo's cases are the class's: the course's salt, and a grading server of this process's own that keeps
    # the outputs of every failed verdict (started at the first hidden test, with this environment).
    import grade_class
    os.environ["ATTNCOURSE_GRADING_SALT"] = grade_class.course_salt(root)
    keep = tempfile.mkdtemp(prefix="attncourse-report-")
    os.environ["ATTNCOURSE_KEEP_OUTPUTS"] = keep
    out = root / ("reports-anonymous" if args.anonymous else "reports")
    out.mkdir(exist_ok=True)
    t0, data = time.perf_counter(), []
    try:
        for chapter in chapters:
            d = chapter_data(chapter, root, keep)
            render(d, args.anonymous, out)
            data.append(d)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    write_diagnoses(out / "diagnoses.csv" if args.anonymous else root / "diagnoses.csv", data, args.anonymous)
    links = ""
    for d in data:
        graded, lost = len(d["scores"]), len(d["rows"])
        counted = translate(f"{graded} graded submissions, {lost} test cells lost")
        links += f'<li><a href="{d["chapter"]}.html">{d["chapter"]}</a>: {html.escape(counted)}</li>'
    lang = "zh-CN" if language() == "zh" else "en"
    title = html.escape(translate("What the class got wrong"))
    (out / "index.html").write_text(f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8"><title>{title}'
                                    f"</title><style>{CSS}</style></head><body><h1>{title}</h1><ul>{links}</ul></body></html>",
                                    encoding="utf-8")
    index, took = out / "index.html", time.perf_counter() - t0
    print(translate(f"class report: {index} ({took:.1f} s)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
