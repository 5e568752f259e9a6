"""A synthetic translation task: dates written many ways -> ISO 8601 ("21 Nov 2026" -> "2026-11-21").

Deterministic given a seed, generated on the fly (nothing downloaded).  Characters are the tokens:

    from attncourse import dates
    train, test = dates.split(n_train=20_000, n_test=1_000, seed=0)
    train[0]                       # ('Saturday, 21 November 2026', '2026-11-21')
    batch = dates.encode_batch(train[:4])
    batch.src, batch.src_mask      # [4, S] long (padded with PAD), [4, S] bool (True = real character)
    batch.tgt_in, batch.tgt_out    # [4, 11]: BOS + "2026-11-21", and "2026-11-21" + EOS
"""
import datetime
import random
from dataclasses import dataclass

import torch

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<bos>", "<eos>"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FIRST, LAST = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)   # two-digit years are unambiguous


def _d(x):
    return str(x.day)


FORMATS = {
    "21 Nov 2026": lambda x: f"{x.day} {MONTHS[x.month - 1][:3]} {x.year}",
    "November 21, 2026": lambda x: f"{MONTHS[x.month - 1]} {x.day}, {x.year}",
    "21/11/26": lambda x: f"{x.day:02d}/{x.month:02d}/{x.year % 100:02d}",
    "21.11.2026": lambda x: f"{x.day}.{x.month}.{x.year}",
    "21 November 2026": lambda x: f"{x.day} {MONTHS[x.month - 1]} {x.year}",
    "Nov 21 2026": lambda x: f"{MONTHS[x.month - 1][:3]} {x.day} {x.year}",
    "saturday, 21 november 2026": lambda x: f"{DAYS[x.weekday()]}, {x.day} {MONTHS[x.month - 1]} {x.year}".lower(),
    "Sat 21 Nov 26": lambda x: f"{DAYS[x.weekday()][:3]} {x.day} {MONTHS[x.month - 1][:3]} {x.year % 100:02d}",
    "2026/11/21": lambda x: f"{x.year}/{x.month:02d}/{x.day:02d}",
    "21-NOV-2026": lambda x: f"{x.day:02d}-{MONTHS[x.month - 1][:3].upper()}-{x.year}",
}


def iso(date):
    return date.isoformat()


class Vocab:
    """Characters <-> ids.  Ids 0, 1, 2 are PAD, BOS and EOS."""

    def __init__(self, characters):
        self.tokens = SPECIALS + sorted(set(characters))
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self):
        return len(self.tokens)

    def encode(self, text, bos=False, eos=False):
        return [BOS] * bos + [self.index[ch] for ch in text] + [EOS] * eos

    def decode(self, ids):
        """Ids -> text, stopping at the first EOS and skipping PAD and BOS."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.tokens[i])
        return "".join(out)


def _all_characters():
    chars = set("0123456789 ,./-")
    for name in MONTHS + DAYS:
        chars |= set(name) | set(name.lower()) | set(name.upper())
    return chars


VOCAB = Vocab(_all_characters())


def random_date(rng):
    return FIRST + datetime.timedelta(days=rng.randrange((LAST - FIRST).days + 1))


def sample(n, seed, formats=None):
    """n (source, target) pairs: a random date in a random format, and its ISO form."""
    rng = random.Random(seed)
    names = list(formats or FORMATS)
    pairs = []
    for _ in range(n):
        date = random_date(rng)
        pairs.append((FORMATS[rng.choice(names)](date), iso(date)))
    return pairs


def split(n_train, n_test, seed=0):
    """Training and held-out pairs; no held-out date (in any format) occurs in training."""
    pairs = sample(n_train + 3 * n_test, seed)
    test_dates = []
    seen = set()
    for src, tgt in pairs[n_train:]:
        if tgt not in seen:
            seen.add(tgt)
            test_dates.append((src, tgt))
    test = test_dates[:n_test]
    held = {t for _, t in test}
    train = [p for p in pairs[:n_train] if p[1] not in held]
    return train, test


@dataclass
class Batch:
    src: torch.Tensor        # [B, S] long, PAD after each source's end
    src_mask: torch.Tensor   # [B, S] bool, True at real characters
    tgt_in: torch.Tensor     # [B, T] long: BOS, y_1, ..., y_{T-1}  (the decoder's inputs, teacher forcing)
    tgt_out: torch.Tensor    # [B, T] long: y_1, ..., y_{T-1}, EOS  (what it must predict), PAD-padded


def pad(seqs, value=PAD):
    width = max(len(s) for s in seqs)
    return torch.tensor([list(s) + [value] * (width - len(s)) for s in seqs], dtype=torch.long)


def encode_batch(pairs, vocab=VOCAB):
    src = pad([vocab.encode(s) for s, _ in pairs])
    tgt = [vocab.encode(t) for _, t in pairs]
    return Batch(src, src != PAD, pad([[BOS] + t for t in tgt]), pad([t + [EOS] for t in tgt]))


def batches(pairs, batch_size, seed=0, vocab=VOCAB):
    """Shuffled mini-batches (a new order every call with a different seed); the last may be smaller."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    for i in range(0, len(order), batch_size):
        yield encode_batch([pairs[j] for j in order[i: i + batch_size]], vocab)


def reversal(n, min_len, max_len, seed=0):
    """The reversal task: random digit strings of min_len..max_len characters -> the same digits reversed.

    Long inputs are where a fixed-size context vector breaks down (chapter 01's bottleneck experiment).
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len)))
        out.append((s, s[::-1]))
    return out
