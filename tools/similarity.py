"""Near-copies among a class's solutions and of the reference: python tools/similarity.py CHAPTER [--root DIR]

Answers leak (students share, old repositories exist), so after grading each submission's solution cells are
compared, exercise by exercise, with the reference's body and with every classmate's.  The method is MOSS's
winnowing (Schleimer, Wilkerson and Aiken, 2003) over normalised code: comments, docstrings and layout dropped,
every name that is not an attribute or a keyword replaced by one symbol, numbers and strings by one each, so
renaming variables or reformatting changes nothing; k-grams of those tokens are hashed and, of every window of
w hashes, the smallest is kept as a fingerprint.  The similarity of two solutions is the share of the smaller
one's fingerprints that the other has.

A short exercise has few fingerprints and honest solutions that look alike (a three-line mask), so a pair is
listed only when the smaller side has at least MIN_FINGERPRINTS fingerprints and its similarity is at least
THRESHOLD; a pair of classmates must also stand out from the class, above the exercise's median classmate
pair by MARGIN.  Honest independent solutions of chapter 02's attention share about a quarter of their
fingerprints with each other and with the reference (tests/test_similarity.py).  The report is a list of
places to look, not a verdict.
"""
import argparse
import csv
import functools
import hashlib
import io
import itertools
import keyword
import re
import statistics
import sys
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

K, W = 5, 4                       # k-gram length and winnowing window (in normalised tokens)
THRESHOLD, MARGIN, MIN_FINGERPRINTS = 0.8, 0.25, 8
REFERENCE = "(reference)"


def normalised(source):
    """The tokens of ``source`` with names, numbers and strings made anonymous; comments, docstrings and layout gone.
    Attribute names (after a dot) and keywords stay: they are what the code does, not what it calls things."""
    out, previous = [], None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        if tok.type == tokenize.STRING:
            if previous in (None, ":") and tok.string.startswith(('"""', "'''", 'r"""')):
                continue                                          # a docstring
            text = "S"
        elif tok.type == tokenize.NUMBER:
            text = "N"
        elif tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) and previous != ".":
            text = "V"
        else:
            text = tok.string
        out.append(text)
        previous = tok.string
    return out


def fingerprints(source):
    """MOSS winnowing: the set of minimum k-gram hashes of every window of W consecutive k-grams."""
    tokens = normalised(source)
    grams = [int.from_bytes(hashlib.blake2b(" ".join(tokens[i:i + K]).encode(), digest_size=8).digest(), "big")
             for i in range(len(tokens) - K + 1)]
    if len(grams) <= W:
        return set(grams)
    return {min(grams[i:i + W]) for i in range(len(grams) - W + 1)}


def similarity(a, b):
    """Share of the smaller fingerprint set found in the other (containment), 0 when either is empty."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))


def solutions(nb):
    """{solution grade_id: source} of a notebook's solution cells."""
    return {nbtools.grade_info(c)["grade_id"]: c.source for c in nb.cells if nbtools.is_solution(c)}


def reference_body(region):
    """The body of the reference function or method a solution region delegates to, read from the reference
    package's source file without importing it (the grader runs with ATTNCOURSE_GRADING_KERNEL set, and the
    package refuses to be imported there); None where it cannot be found."""
    import ast
    import importlib.util
    m = nbtools._REF_IMPORT.search(region)
    spec = importlib.util.find_spec("attncourse_ref")       # a top-level package: found, not imported
    if not m or spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent.joinpath(*m.group(1).split(".")[1:]).with_suffix(".py")
    if not path.exists():
        return None
    lines, defs = _parsed(path)
    node = defs.get(m.group(2))
    method = nbtools._REF_METHOD.search(region)
    if node is not None and method:
        node = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == method.group(1)), None)
    if node is None:
        return None
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
        and len(node.body) > 1 else node.body
    return "\n".join(_segment(lines, n) for n in body)


@functools.lru_cache(maxsize=None)
def _parsed(path):
    """(the lines of a reference source file, its top-level functions and classes by name): parsed once per run."""
    import ast
    source = path.read_text(encoding="utf-8")
    # Lines end as the tokenizer ends them (\r\n, \r or \n only): str.splitlines also splits at \f, \x1c or \u2028.
    return (re.findall(r"[^\r\n]*(?:\r\n?|\n)?", source),
            {node.name: node for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))})


def _segment(lines, node):
    """ast.get_source_segment from lines split once (it splits the whole file again on every call: a class's
    report spent 1.2 s of its 2 s there).  Column offsets count UTF-8 bytes, as in the stdlib."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def reference_sources(source_nb):
    """{solution grade_id: the reference's body} from the instructor notebook's solution regions."""
    out = {}
    for cell in source_nb.cells:
        if nbtools.is_solution(cell) and nbtools.BEGIN in cell.source:
            body = reference_body(cell.source.split(nbtools.BEGIN, 1)[1].split(nbtools.END, 1)[0])
            if body:
                out[nbtools.grade_info(cell)["grade_id"]] = body
    return out


def near_copies(submissions, references, stub_sources=None):
    """[(exercise, who, whom, similarity)] of the pairs that stand out: ``submissions`` {student: {grade_id:
    source}}, ``references`` {grade_id: reference body}; a solution still the release's stub is left out."""
    stub_sources = stub_sources or {}
    found = []
    for gid in sorted({g for subs in submissions.values() for g in subs}):
        prints = {s: fingerprints(subs[gid]) for s, subs in submissions.items()
                  if gid in subs and subs[gid].strip() != stub_sources.get(gid, "").strip()}
        if gid in references:
            prints[REFERENCE] = fingerprints(references[gid])
        pairs = [(a, b, similarity(prints[a], prints[b])) for a, b in itertools.combinations(sorted(prints), 2)
                 if min(len(prints[a]), len(prints[b])) >= MIN_FINGERPRINTS]
        if not pairs:
            continue
        # A classmate pair must also stand out from the class's pairs (honest short solutions look alike); the
        # reference is held to the threshold alone, or a class that copied it whole would show nothing.
        classmates = [s for a, b, s in pairs if REFERENCE not in (a, b)]
        typical = statistics.median(classmates) if classmates else 0.0
        for a, b, s in pairs:
            if s >= THRESHOLD and (REFERENCE in (a, b) or s >= typical + MARGIN):
                who, whom = (b, a) if a == REFERENCE else (a, b)
                found.append((gid, who, whom, round(s, 3)))
    return sorted(found, key=lambda f: (f[0], -f[3]))


def report(chapter, root):
    """Compare the class's submissions of ``chapter`` under ``root``; write similarity_<chapter>.csv; return its rows."""
    root = Path(root)
    name = nbtools.chapter_notebook(chapter).name
    source = nbtools.read(root / "chapters" / chapter / name)
    release = root / "release" / chapter / name
    stubs = solutions(nbtools.read(release)) if release.exists() else {}
    submissions = {}
    for path in sorted((root / "submitted").glob(f"*/{chapter}/{name}")):
        try:
            submissions[path.parent.parent.name] = solutions(nbtools.read(path))
        except Exception:                       # an unreadable notebook is the grader's report's business
            continue
    rows = near_copies(submissions, reference_sources(source), stubs)
    with open(root / f"similarity_{chapter}.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["exercise", "student", "similar to", "similarity"])
        out.writerows(rows)
    return rows


def describe(chapter, rows, limit=20):
    """The grader's report on near-copies (the first ``limit`` of ``rows``), in the instructor's language
    (ATTNCOURSE_LANGUAGE=zh: Chinese)."""
    from attncourse.i18n import translate

    def name(who):
        return translate("the reference solution") if who == REFERENCE else who
    if not rows:
        return []
    lines = [translate(f"{len(rows)} near-copies (similarity_{chapter}.csv), to read before releasing grades:")]
    for gid, who, whom, share in rows[:limit]:
        lines.append("  " + translate(f"{gid}: {name(who)} ~ {name(whom)} ({share:.0%} of the shorter solution's "
                                      "fingerprints shared)"))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapter")
    ap.add_argument("--root", default=str(nbtools.ROOT))
    args = ap.parse_args(argv)
    rows = report(args.chapter, args.root)
    print("\n".join(describe(args.chapter, rows, limit=len(rows))) or f"no near-copies in {args.chapter}")


if __name__ == "__main__":
    main()
