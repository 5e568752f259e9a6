"""What the prose says about a run, and the check of it against the executed page.

Each claim ties a sentence of a chapter's text to the printed output of the cell that backs it.
``tests/test_site.py`` checks every claim on the notebooks the site build executed: if a library
upgrade, a new seed or an edit changes a result, the test names the sentence that became false.
A claim whose sentence was reworded fails too, so that the list is kept in step with the text.
"""
import re
from dataclasses import dataclass
from typing import Callable


@dataclass
class Claim:
    says: str                          # words of the prose (whitespace and *emphasis* ignored)
    cell: str                          # a string that only the backing code cell's source contains
    holds: Callable[[str], bool]       # given that cell's printed output


def numbers(pattern, text):
    """Every match of ``pattern`` (one group, a number with optional commas) as floats."""
    return [float(m.replace(",", "")) for m in re.findall(pattern, text)]


def row(text, label):
    """The numbers of the output line that starts with ``label``."""
    line = next(line for line in text.splitlines() if line.strip().startswith(label))
    return numbers(r"(-?\d[\d,]*\.?\d*(?:e[-+]\d+)?)", line[line.index(label) + len(label):])


def _hand_made(out, part):
    """{run: answer} of part 1 or 2 of chapter 05's hand-made decoders (§5.10)."""
    section = out.split(f"{part}. ", 1)[1].split("\n\n", 1)[0]
    return {line[:22].strip(): line[22:].split("log P")[0].strip() for line in section.splitlines()[1:]}


# The rows of chapter 05's beam search table (§5.10).
_BEAM_ROWS = ["width 1 (greedy)", "width 3, alpha 0.0", "width 3, alpha 0.6", "width 5, alpha 0.0", "width 5, alpha 0.6"]


def _linear_costs(out):
    """{form: time ratio} over the last 4-fold growth of T in chapter 03's cost table (§3.8)."""
    line = next(line for line in out.splitlines() if line.startswith("T x 4"))
    return {name: float(x) for name, x in re.findall(r"(\w+) x ([\d.]+)", line.split("time", 1)[1])}


CLAIMS = {
    "ch00": [
        Claim("With a constant start the table stays rank 1: eight dimensions paid for, one used, and a worse loss",
              "chars_text = shakespeare.text",
              lambda out: row(out, "constant init:")[-1] == 1 and row(out, "random init:")[-1] == 8
              and row(out, "constant init:")[0] > row(out, "random init:")[0]),
        Claim("father - man + woman gives wife and mother, king - man + woman gives queen, son - father + mother "
              "gives daughter, his - he + she gives her", "questions = [",
              lambda out: all(s in out for s in ["father - man + woman = wife, mother", "king - man + woman = queen",
                                                 "son - father + mother = daughter", "his - he + she = her"])),
        Claim("France with England and with le, la, de, the French spoken in the plays' scenes set in France",
              "for w in [", lambda out: "france: england, le, la, de" in out),
        Claim("France - French + English finds king before England", "questions = [",
              lambda out: "france - french + english = king, england" in out),
    ],
    "ch01": [
        Claim("the model gets nearly every held-out date right", "DATE_STEPS =",
              lambda out: numbers(r"exact match on 1,000 held-out dates: ([\d.]+)%", out)[0] >= 95),
        Claim("Without attention, accuracy collapses after a handful of digits", "MAX_DIGITS =",
              lambda out: row(out, "no attn")[5] < 0.2 and row(out, "no attn")[0] > 0.9),
        Claim("With attention the decoder looks up the digit it needs at each step, and accuracy falls off much "
              "more slowly with length", "MAX_DIGITS =",
              lambda out: all(a > n for a, n in zip(row(out, "attention")[3:], row(out, "no attn")[3:]))),
    ],
    "ch02": [
        Claim("row it puts most of its weight on animal", "tokens = [", lambda out: "attends most to: animal" in out),
    ],
    "ch03": [
        # Timed in turn on one thread, the least of three rounds. On the slower 2-core machine, 1,024 to 4,096 tokens:
        # recurrent x 3.3 to 4.0, chunked x 3.3 to 5.4, softmax x 26 to 50, parallel x 57 to 70 (3.3 and 50 beside a
        # full test run); at 4,096 tokens chunked 18 to 36 ms, the next fastest (parallel) 160 to 220 ms.
        Claim("With a sequence 4 times longer, the recurrent and the chunked forms take 3 to 6 times as long (4 for a "
              "cost linear in $T$), softmax attention and the parallel form more than 10 times as long",
              "lengths = [256, 512, 1024]",
              lambda out: all(2 < _linear_costs(out)[f] < 8 for f in ("recurrent", "chunked"))
              and all(_linear_costs(out)[f] > 10 for f in ("softmax", "parallel"))),
        Claim("At 4,096 tokens the chunked form is the fastest of the four", "lengths = [256, 512, 1024]",
              lambda out: (lambda r: r[3] < 0.6 * min(r[:3]))(row(out, "4096"))),
        Claim("The state stays 1,056 numbers at every length; the table of the parallel form holds 16.8 million at "
              "4,096 tokens", "lengths = [256, 512, 1024]",
              lambda out: "state 1,056 numbers, table 16,777,216" in out),
        Claim("Linear attention ends with the higher validation loss, by about a tenth of a nat", "class TinyLM(",
              # 2.409 against 2.280 on the slower machine
              lambda out: 0.05 <= row(out, "linear")[-1] - row(out, "softmax")[-1] <= 0.2),
        Claim("At every count the delta rule reads back with a smaller error than the sum", "counts = [4, 8",
              lambda out: all(d < s for d, s in zip(row(out, "delta rule"), row(out, "sum (linear attention)")))),
    ],
    "ch04": [
        Claim("the equivariance gap jumps from rounding error (about 1e-16) to about 0.2",
              "attn = nn.MultiheadAttention(16, 2",
              lambda out: row(out, "attention alone:")[0] < 1e-12 and 0.1 <= row(out, "attention after x + PE:")[0] < 0.35),
        # §4.8: the rows are the loss per block of 64 positions (at 4x: before, then after the fine-tune).
        Claim("Without scaling, the model reads twice its trained length almost as well as the trained part, but at "
              "four times its loss climbs in the second half", "class RopeLM",
              lambda out: row(out, "2x no scaling")[1] - row(out, "2x no scaling")[0] < 0.15
              and min(row(out, "4x no scaling")[2:4]) > row(out, "4x no scaling")[0] + 0.4),
        Claim("Position interpolation without fine-tuning is the worst of the four, even on the first 64 positions",
              "class RopeLM", lambda out: all(row(out, "4x position interpolation")[0] > row(out, f"4x {m}")[0] + 0.3
                                              for m in ("no scaling", "NTK-aware", "YaRN"))),
        Claim("NTK-aware scaling and YaRN keep the loss at four times the length within 0.25 of their loss on the "
              "first 64 positions, without any fine-tuning", "class RopeLM",
              lambda out: all(max(row(out, f"4x {m}")[:4]) - row(out, f"4x {m}")[0] < 0.25 for m in ("NTK-aware", "YaRN"))),
        Claim("NTK-aware scaling and YaRN held their loss at four times the length without fine-tuning, and position "
              "interpolation did worst, even on the trained positions", "class RopeLM",      # the summary's
              lambda out: all(max(row(out, f"4x {m}")[:4]) - row(out, f"4x {m}")[0] < 0.25 for m in ("NTK-aware", "YaRN"))
              and all(row(out, "4x position interpolation")[0] > row(out, f"4x {m}")[0] + 0.3
                      for m in ("no scaling", "NTK-aware", "YaRN"))),
        Claim("Twenty fine-tuning steps at the longer length lower every method's loss, and position interpolation "
              "stays the worst", "class RopeLM",
              lambda out: all(sum(row(out, f"4x {m}")[4:8]) < sum(row(out, f"4x {m}")[:4]) - 0.08
                              for m in ("no scaling", "position interpolation", "NTK-aware", "YaRN"))
              and all(sum(row(out, "4x position interpolation")[4:8]) > sum(row(out, f"4x {m}")[4:8]) + 0.4
                      for m in ("no scaling", "NTK-aware", "YaRN"))),
    ],
    "ch05": [
        Claim("Both models learn the task, and both end above 99% exact match on the 1,000 held-out dates",
              "TRANSFORMER_STEPS, RNN_STEPS", lambda out: row(out, "Transformer")[-1] >= 99
              and row(out, "GRU + attention")[-1] >= 99),
        # The two models train a step each in turn, so a busy machine slows both alike: the seconds' ratio was 0.39 on
        # one machine, 0.53 on a slower one and 0.56 there in a test run; trained one after the other, it reached 0.75.
        # With 230 and 170 steps (the GRU at 95% after 90 steps, the Transformer after 120): 0.36 idle, 0.37 busy.
        Claim("the recurrent model gets there first: it passes the 95% mark in no more steps than the Transformer and "
              "in far fewer seconds", "TRANSFORMER_STEPS, RNN_STEPS",
              lambda out: row(out, "GRU + attention")[-3] <= row(out, "Transformer")[-3]
              and row(out, "GRU + attention")[-2] < 0.75 * row(out, "Transformer")[-2]),
        Claim("At the smaller learning rate the two curves lie almost on top of each other", "def loss_curve",
              lambda out: abs(row(out, "lr 0.003 post-norm:")[-1] - row(out, "lr 0.003 pre-norm :")[-1]) < 0.15),
        Claim("At the larger learning rate they part", "def loss_curve",
              lambda out: row(out, "lr 0.01 post-norm:")[-1] - row(out, "lr 0.01 pre-norm :")[-1] > 0.3),
        Claim("The two new projections get nearly every token right", "def projection_inputs",
              lambda out: min(row(out, "new projection, eps = 0.0")[1], row(out, "new projection, eps = 0.1")[1]) >= 99.5),
        Claim("Without smoothing the confidence is above 99.9% and the logit gap several times the smoothed one",
              "def projection_inputs", lambda out: row(out, "new projection, eps = 0.0")[0] > 0.999
              and row(out, "new projection, eps = 0.0")[2] > 3 * row(out, "new projection, eps = 0.1")[2]),
        Claim("with $\\varepsilon = 0.1$ the confidence settles near $1 - \\varepsilon + \\varepsilon/V$ and the gap near",
              "def projection_inputs",
              lambda out: abs(row(out, "new projection, eps = 0.1")[0] - row(out, "optimum for eps = 0.1")[0]) < 0.01
              and abs(row(out, "new projection, eps = 0.1")[2] - row(out, "optimum for eps = 0.1")[1]) < 0.4),
        Claim("measured by the plain cross-entropy, the smoothed projection is worse on the held-out dates",
              "def projection_inputs",
              lambda out: row(out, "new projection, eps = 0.1")[-1] > row(out, "new projection, eps = 0.0")[-1]),
        Claim("and two tokens within rounding of each other can come out in either order), and so do widths 3 and 5, "
              "with $\\alpha = 0$ and with $\\alpha = 0.6$, with the same exact match and the same mean log-probability",
              "def beam_translate",
              lambda out: all(row(out, r)[3] == 0 and row(out, r)[0] == row(out, "width 1 (greedy)")[0]
                              and abs(row(out, r)[2] - row(out, "width 1 (greedy)")[2]) < 1e-4 for r in _BEAM_ROWS)),
        Claim("greedy decoding commits to A, and a beam of two keeps B as well and finds the likelier answer",
              "def hand_made", lambda out: _hand_made(out, 1)["greedy decoding"] == "A <eos>"
              and _hand_made(out, 1)["beam 2, alpha 0.0"] == "B <eos>"
              and row(out, "beam 2, alpha 0.0")[-2] > row(out, "beam 1, alpha 0.0")[-2]),
        Claim("the plain log-probability and $\\alpha = 0.6$ keep the short answer, while $\\alpha = 1$ divides enough "
              "out of the long one's log-probability to prefer it", "def hand_made",
              lambda out: _hand_made(out, 2)["beam 2, alpha 0.0"] == _hand_made(out, 2)["beam 2, alpha 0.6"] == "<eos>"
              and _hand_made(out, 2)["beam 2, alpha 1.0"] == "A C <eos>"),
        Claim("The model of §5.9 is sure of almost every token", "def projection_inputs",
              lambda out: row(out, "§5.9's model (eps = 0)")[0] > 0.99),
        Claim("every answer has 11 tokens (10 characters and `<eos>`)", "def beam_translate",
              lambda out: all(row(out, r)[1] == 11 for r in _BEAM_ROWS)),
        Claim("a beam of 5 decodes five hypotheses of every date, and takes several times greedy decoding's time",
              "def beam_translate", lambda out: min(row(out, "width 5, alpha 0.0")[-1], row(out, "width 5, alpha 0.6")[-1])
              > 2 * row(out, "width 1 (greedy)")[-1]),
    ],
    "ch06": [
        Claim("MLA, which caches 40 numbers per token and layer against multi-head attention's 128 (less than a third)",
              "def train_with(", lambda out: row(out, "MLA, r 32, rope 8")[-2] == 40
              and row(out, "multi-head (6.4, step 100)")[-2] == 128),
        # §6.8's three layers after 100 steps of §6.4's recipe: multi-head 2.791, GQA 2.960, MLA 2.515 here (MLA
        # lowest by 0.28, GQA behind multi-head by 0.17, all at least 0.44 above step 900's 2.079). The checks keep
        # margins that a machine whose floating point trains slightly different models keeps.
        Claim("has the lowest validation loss of the three, by more than a tenth of a nat", "def train_with(",
              lambda out: row(out, "MLA, r 32, rope 8")[-1] + 0.1 < min(row(out, "multi-head (6.4, step 100)")[-1],
                                                                         row(out, "GQA, 2 kv heads")[-1])),
        Claim("At step 100 the three are early in their training, all well above the loss that §6.4's model reaches "
              "at step 900 (the last line)", "def train_with(",
              lambda out: out.rstrip().splitlines()[-1].startswith("multi-head (6.4, step 900)")
              and min(row(out, label)[-1] for label in ("multi-head (6.4, step 100)", "GQA, 2 kv heads",
                                                        "MLA, r 32, rope 8"))
              > row(out, "multi-head (6.4, step 900)")[-1] + 0.2),
        Claim("grouped-query attention, behind multi-head attention at step 100", "def train_with(",
              lambda out: row(out, "GQA, 2 kv heads")[-1] > row(out, "multi-head (6.4, step 100)")[-1] + 0.05),
        Claim("At the course's width, with 8 heads, MLA's 288 numbers lie between grouped-query attention with two "
              "key/value heads (256) and multi-head attention (1,024): the latent is as large as the cache of 2.25 "
              "key/value heads", "def per_token(kind",
              lambda out: row(out, "MLA (r 256, rope 32)")[-1] == 288 and row(out, "GQA (2 kv heads)")[-1] == 256
              and row(out, "multi-head (8 kv heads)")[-1] == 1024 and 288 / (2 * 64) == 2.25),
        Claim("With DeepSeek-V3's 128 heads the latent stays at 576 numbers while multi-head attention would cache "
              "40,960: 71 times less, 8.6 GiB instead of 610 GiB for a context of 131,072 tokens, and 4.4 times less "
              "than grouped-query attention with 8 key/value heads", "def per_token(kind",
              lambda out: row(out, "MLA (r 512, rope 64)")[0] == 576 and row(out, "multi-head (128 heads)")[0] == 40960
              and row(out, "MLA (r 512, rope 64)")[-1] == 8.6 and row(out, "multi-head (128 heads)")[-1] == 610.0
              and "multi-head / MLA = 71.1, GQA / MLA = 4.44" in out),
        Claim("the gap widens with the length: the speed-up column", "no cache (tok/s)",
              # from the shortest text to the longest the speed-up grows by 30% at least, and the cache pays at
              # once: 2.2x, 3.5x, 5.8x on one machine; 1.4x, 1.8x, 2.6x on a slower one, and 1.4x, 2.0x, 2.9x there
              # beside two busy processes, with and without the cache timed in turn (1.4x, 1.2x, 2.6x in a test run
              # before they were). The middle length is not compared with its neighbours: a clean-clone run on an
              # AMD machine printed 2.2x, 1.9x, 3.2x.
              lambda out: numbers(r"([\d.]+)x", out)[-1] > 1.3 * numbers(r"([\d.]+)x", out)[0]
              and numbers(r"([\d.]+)x", out)[0] > 1.1),
        Claim("the table of §6.6 puts GPT-3's cache for one sequence of 131,072 tokens at 576 GiB",
              "layers, width = 96, 12_288", lambda out: row(out, "131,072")[-1] == 576.0),
        Claim("The measured ratio is $H / n_{kv}$ exactly", "cache_bytes[n_kv] = k.nbytes + v.nbytes",
              lambda out: all(row(out, f"{n}   ")[-2] == row(out, f"{n}   ")[-1] == 8 // n for n in (8, 4, 2, 1))),
        Claim("With 4 key/value heads nothing is pooled and the loss is the trained model's", "def to_gqa(",
              lambda out: row(out, "GQA, 4 kv heads")[-1] == row(out, "multi-head (trained)")[-1]),
        Claim("Pooling costs loss, and more as the groups grow", "def to_gqa(",
              lambda out: row(out, "GQA, 1 kv heads")[-1] > row(out, "GQA, 2 kv heads")[-1]
              > row(out, "GQA, 4 kv heads")[-1]),
        Claim("with the bigram it falls as $k$ grows, since a long draft is rarely accepted to its end, while the tokens "
              "per target pass still grow", "bigram = Bigram(",
              lambda out: [row(out, f"bigram, k = {k}")[1] for k in (1, 2, 4, 8)]
              == sorted((row(out, f"bigram, k = {k}")[1] for k in (1, 2, 4, 8)), reverse=True)
              and [row(out, f"bigram, k = {k}")[2] for k in (1, 2, 4, 8)]
              == sorted(row(out, f"bigram, k = {k}")[2] for k in (1, 2, 4, 8))),
        Claim("hardly changes with $k$", "bigram = Bigram(",
              lambda out: all(max(row(out, f"{d}, k = {k}")[3] for k in (1, 2, 4, 8))
                              - min(row(out, f"{d}, k = {k}")[3] for k in (1, 2, 4, 8)) <= 0.05
                              for d in ("bigram", "1-layer GPT"))),
        # For long drafts the text claims no direction: the bigram's k = 8 was overestimated by more than a tenth on
        # one machine and matched to the hundredth on another (their floating point trains other models). For k = 2
        # the one-layer draft's prediction was 5.5% off on an AMD machine (2.07 against 2.19 measured, 600 tokens):
        # "within a tenth", not "matches".
        Claim("the prediction is within a tenth of the measurement for $k$ of 1 and 2", "bigram = Bigram(",
              lambda out: all(abs(row(out, f"{d}, k = {k}")[4] - row(out, f"{d}, k = {k}")[2])
                              <= 0.1 * row(out, f"{d}, k = {k}")[2] for d in ("bigram", "1-layer GPT") for k in (1, 2))),
        Claim("Both drafts are much weaker models than the target (compare the validation losses)", "bigram = Bigram(",
              lambda out: min(numbers(r"validation loss: .*bigram ([\d.]+)", out)[0],
                              numbers(r"validation loss: .*1-layer GPT ([\d.]+)", out)[0])
              > numbers(r"validation loss: target GPT ([\d.]+)", out)[0] + 0.1),
        # At k = 8 the bigram's speed-up was 0.94x and 0.99x on a busy machine (1.23x to 1.44x idle): the text
        # claims k = 2 and 4, with a tenth to spare (1.46x and 1.27x in the run that showed 0.99x).
        Claim("With the bigram, for $k$ of 2 and 4, speculative sampling is faster than sampling from the target "
              "alone", "bigram = Bigram(", lambda out: all(row(out, f"bigram, k = {k}")[-1] > 1.1 for k in (2, 4))),
        # A timing claim holds with a margin a busy machine cannot erase: at k = 1 the two speed-ups were once
        # 1% apart (0.89x against 0.88x), so the text claims k >= 2 only, and "clearly": at least 15% apart.
        Claim("With the one-layer GPT it is clearly slower than with the bigram for $k$ of 2 and more, although the "
              "two drafts are accepted about as often", "bigram = Bigram(",
              lambda out: all(row(out, f"1-layer GPT, k = {k}")[-1] < 0.85 * row(out, f"bigram, k = {k}")[-1]
                              for k in (2, 4, 8))
              and all(abs(row(out, f"1-layer GPT, k = {k}")[1] - row(out, f"bigram, k = {k}")[1]) < 0.1
                      for k in (1, 2, 4, 8))),
        Claim("sampling from the one-layer GPT alone is less than four times as fast as from the target",
              "bigram = Bigram(", lambda out: numbers(r"plain sampling.*1-layer GPT (\d+)", out)[0]
              < 4 * numbers(r"plain sampling.*target GPT (\d+)", out)[0]),
        Claim("and compared with one pass of full-length attention under your mask. The cache's size is printed too: it "
              "stops at `sinks` $+ W$", "rolling_cache_update(cache, k[...",
              lambda out: numbers(r"attention\| = ([\d.e+-]+);", out)[0] < 1e-12
              and numbers(r"never held more than (\d+) entries", out)[0] == 4 + 16),
        Claim("Up to position 15 the three curves are one", "class WindowedAttention",
              lambda out: row(out, "full attention")[-2] == row(out, "window 16 ")[-2] == row(out, "window 16 + 4")[-2]),
        Claim("the window costs the model a few hundredths of a nat per character", "class WindowedAttention",
              lambda out: 0.01 <= row(out, "window 16 ")[-1] - row(out, "full attention")[-1] <= 0.1),
        Claim("the four sinks win back almost none of it", "class WindowedAttention",
              lambda out: abs(row(out, "window 16 + 4")[-1] - row(out, "window 16 ")[-1])
              <= 0.2 * (row(out, "window 16 ")[-1] - row(out, "full attention")[-1])),
        Claim("at most 2% of a query's weight lands on the first position, in either layer, and under 10% on the first "
              "four", "class WindowedAttention",
              lambda out: max(numbers(r"([\d.]+)%", out.split("first position, by layer:")[1].split(";")[0])) <= 2.0
              and max(numbers(r"([\d.]+)%", out.split("on the first four:")[1])) < 10.0),
        # 100 steps of fine-tuning: both columns of both copies below the row before it (by 0.04 at least here);
        # after 75 steps the copy with sink logits was still above it inside the first window (2.120 against 2.111).
        Claim("Both copies gain from the extra steps", "def finetune(",
              lambda out: all(a < b for label in ("100 steps without", "100 steps with learned")
                              for a, b in zip(row(out, label), row(out, "before fine-tuning")))),
        Claim("the copy with them still ends with a higher loss than the copy without, inside the first window and past it",
              "def finetune(", lambda out: all(a > b for a, b in zip(row(out, "100 steps with learned"),
                                                                      row(out, "100 steps without")))),
        Claim("The course's small model puts at most 2% of its weight on the first position", "class WindowedAttention",
              lambda out: max(numbers(r"([\d.]+)%", out.split("first position, by layer:")[1].split(";")[0])) <= 2.0),
        Claim("training pushes every one of them down from 0 (the last line)", "def finetune(",
              lambda out: max(numbers(r"(-?[\d.]+)", out.split("learned sink logits, by layer:")[1])) < 0),
        Claim("Alternating halves the cache: the full layers still grow with the text, and the window layers add a "
              "constant 4.5 MiB. A model with only window layers would keep 9 MiB at any length", "def kv_cache_bytes",
              lambda out: row(out, "alternating (gpt-oss)")[-1] - 4.5 == row(out, "every layer full")[-1] / 2
              and row(out, "every layer a window of 128")[-2:] == [9.0, 9.0]),
    ],
    "ch07": [
        Claim("on the test images the CNN makes fewer mistakes with a similar budget of parameters",
              "images.digits(test_size=0.2",
              lambda out: numbers(r"CNN: .*\((\d+) of 360 wrong\)", out)[0] < numbers(r"ViT: .*\((\d+) of 360 wrong\)", out)[0]),
        Claim("the ViT ends closer to the floor than the CNN", "images.digits(test_size=0.2",
              lambda out: numbers(r"ViT: .*final training loss ([\d.]+)", out)[0]
              < numbers(r"CNN: .*final training loss ([\d.]+)", out)[0]),
    ],
    "ch08": [
        Claim("The two parameter columns agree to within about 3%", "def n_params",
              lambda out: all(abs(float(line.rsplit("|", 1)[1]) - 1) <= 0.035 for line in out.splitlines()
                              if line.count("|") == 3 and line.split()[0].isdigit())),
        Claim("today's block ends lower", "gelu_mlp = lambda d",
              lambda out: row(out, "today:")[-1] < row(out, "2017:")[-1]),
        Claim("At this size and number of steps the validation curves lie close together", "compared = [dense_name",
              lambda out: abs(row(out, "dense SwiGLU")[-2] - row(out, "MoE 8 experts, top-2")[-2]) < 0.05),
        Claim("on a CPU, at this size, the MoE is the slower one", "compared = [dense_name",
              lambda out: row(out, "MoE 8 experts, top-2")[-1] < 0.8 * row(out, "dense SwiGLU")[-1]),    # 14k against 28k here
        Claim("Without the balance loss the router collapses", "x_val, _ = data.batch(",
              lambda out: max(row(out, "MoE, no load balancing")[:4]) > 50 and max(row(out, "MoE 8 experts, top-2")[:4]) < 45),
        Claim("With neither method the busiest expert of some layer takes more than twice its share", "GAMMA = 0.03",
              lambda out: max(row(out, "neither")[:4]) > 2),
        Claim("the load-balancing loss and the bias update both keep every layer's busiest expert under 1.8 times its "
              "share", "GAMMA = 0.03",
              lambda out: max(row(out, "load-balancing loss")[:4]) < 1.8 and max(row(out, "bias update")[:4]) < 1.8),
        Claim("At this size and length of training the three validation losses lie within 0.05 of each other",
              "GAMMA = 0.03",
              lambda out: max(row(out, label)[-1] for label in ("neither", "load-balancing loss", "bias update"))
              - min(row(out, label)[-1] for label in ("neither", "load-balancing loss", "bias update")) < 0.05),
    ],
    "ch09": [
        Claim("Without clipping, AdamW ends with the same weights whether or not the division is there, while SGD's "
              "weights end far apart", "def accumulation_run(",
              lambda out: row(out, "AdamW, clip off:")[-1] < 0.01 and row(out, "SGD, clip off:")[-1] > 0.1),
        Claim("The logged loss is four times too large under both", "def accumulation_run(",
              lambda out: all(abs(row(out, f"{o}, clip {c}:")[3] / row(out, f"{o}, clip {c}:")[2] - 4) < 0.05
                              for o in ("SGD", "AdamW") for c in ("at 1", "off"))),
        Claim("With clipping, the run without the division is clipped on more steps, and AdamW's weights no longer "
              "agree either", "def accumulation_run(",
              lambda out: all(row(out, f"{o}, clip at 1:")[1] > row(out, f"{o}, clip at 1:")[0] for o in ("SGD", "AdamW"))
              and row(out, "AdamW, clip at 1:")[-1] > 0.05),
        Claim("Both ways of writing the formula as it stands give `inf` on these two positions", "as_written = (z.exp()",
              lambda out: "as written: inf" in out and re.search(r"-log\(softmax\(z\)\[t\]\)\s*: inf", out) is not None),
        Claim("With each row's maximum subtracted, your function and PyTorch's agree", "as_written = (z.exp()",
              lambda out: row(out, "your cross_entropy")[0] == row(out, "F.cross_entropy")[0] > 0),
        Claim("The two models take the same steps and end with the same weights, to within float32 rounding",
              "def param_groups(model):",
              lambda out: row(out, "largest difference in the weights after 20 steps:")[0] < 1e-5
              and row(out, "your AdamW:")[2] < row(out, "your AdamW:")[0]),
        Claim("The two runs compute the same losses, step for step, to within float32 rounding", "def run_with(optimizer):",
              lambda out: row(out, "largest difference between the two runs' losses over 60 steps:")[0] < 1e-4
              and abs(row(out, "your AdamW")[-2] - row(out, "torch.optim.AdamW")[-2]) < 1e-3),
        Claim("The measured peaks come out below the formula's, by less than a fifth", "def train_step(model, optimizer",
              lambda out: all(0.8 < row(out, label)[m] / row(out, label)[f] <= 1.0
                              for label in ("2 layers x 64, 8 x 64:", "4 layers x 128, 16 x 128:")
                              for f, m in ((0, 1), (2, 3)))),
        Claim("its model state alone is more than an 80 GB GPU holds", "def gib(n):",
              lambda out: sum(row(out, "7B (Llama 2 shape)")[0:4]) * 2 ** 30 > 80e9),
        Claim("The activations of one 4096-token sequence add about half as much again", "def gib(n):",
              lambda out: 0.4 < row(out, "7B (Llama 2 shape)")[4] / sum(row(out, "7B (Llama 2 shape)")[0:4]) < 0.6),
        Claim("two thirds of them the attention weights", "def gib(n):",
              lambda out: row(out, "7B: the attention weights are")[0] == 67),
        Claim("checkpointing cuts them by more than an order of magnitude", "def gib(n):",
              lambda out: row(out, "7B (Llama 2 shape)")[5] * 10 < row(out, "7B (Llama 2 shape)")[4]),
        Claim("With checkpointing the step's peak memory falls to less than a third of what it was",
              "from torch.utils.checkpoint import checkpoint",
              lambda out: row(out, "with checkpointing:")[0] * 3 < row(out, "without:")[0]),
        Claim("In the same time the CPU mode processes more tokens per second and reaches a lower validation loss",
              'compare.load("recipes")',
              lambda out: row(out, "this lab's CPU mode")[-2] > row(out, "classic minimal-GPT recipe")[-2]
              and row(out, "this lab's CPU mode")[-1] < row(out, "classic minimal-GPT recipe")[-1]),
        Claim("its loss ends higher than with the published schedule", 'compare.load("recipes")',
              lambda out: row(out, "minimal recipe's model, schedule fitted")[-1] > row(out, "classic minimal-GPT recipe")[-1]),
        Claim("Doubling its learning rate as well changes its loss little", 'compare.load("recipes")',
              lambda out: abs(row(out, "... and the CPU mode's")[-1] - row(out, "minimal recipe's model, schedule fitted")[-1])
              < 0.05),
        Claim("The fourth row differs from the first in depth alone, and ends well above it", 'compare.load("recipes")',
              lambda out: row(out, "... and the CPU mode's")[-1] - row(out, "this lab's CPU mode")[-1] > 0.1),
        Claim("Each bigger model gets more out of the same text: its curve lies lower at every point",
              "widths = [32, 64, 128, 192]",
              lambda out: all(all(b < a for a, b in zip(lo, hi))
                              for lo, hi in zip(*[[row(out, f"width {w:>3}:")[1:] for w in (32, 64, 128)],
                                                  [row(out, f"width {w:>3}:")[1:] for w in (64, 128, 192)]]))),
    ],
}


def normalise(text):
    return re.sub(r"\s+", " ", text.replace("*", "")).strip()
