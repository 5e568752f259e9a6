"""Near-copies (tools/similarity.py): a pasted reference and a classmate's copy with renamed variables are listed,
two honest solutions written independently are not."""
import similarity

HONEST_A = '''def scaled_dot_product_attention(q, k, v, mask=None):
    d = q.size(-1)
    logits = torch.einsum("...id,...jd->...ij", q, k) * d ** -0.5
    if mask is not None:
        logits = logits.masked_fill(mask.logical_not(), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.einsum("...ij,...jd->...id", probs, v), probs
'''
# A classmate's copy of HONEST_A: every variable renamed, a comment and blank lines added, quotes changed.
RENAMED = '''def scaled_dot_product_attention(q, k, v, mask=None):
    # attention!
    dim = q.size(-1)

    s = torch.einsum('...id,...jd->...ij', q, k) * dim ** -0.5
    if mask is not None:
        s = s.masked_fill(mask.logical_not(), float('-inf'))

    w = s.softmax(dim=-1)
    return torch.einsum('...ij,...jd->...id', w, v), w
'''
HONEST_B = '''def scaled_dot_product_attention(q, k, v, mask=None):
    """My attention."""
    scale = 1.0 / math.sqrt(k.shape[-1])
    e = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        e = torch.where(mask, e, torch.full_like(e, -math.inf))
    e = e - e.amax(dim=-1, keepdim=True)
    a = e.exp() / e.exp().sum(dim=-1, keepdim=True)
    return torch.matmul(a, v), a
'''


def test_pasted_and_renamed_copies_are_listed_and_honest_solutions_are_not(monkeypatch):
    import nbtools
    source = nbtools.read(nbtools.chapter_notebook("ch02"))
    # as in the class grader, where the reference package refuses to be imported: its source is read, not run
    monkeypatch.setenv("ATTNCOURSE_GRADING_KERNEL", "1")
    references = similarity.reference_sources(source)
    assert set(references) == {"sdpa", "causal_mask", "self_attention", "cross_attention", "equivariance_gap"}
    pasted = "def scaled_dot_product_attention(q, k, v, mask=None):\n" + "\n".join(
        "    " + line for line in references["sdpa"].splitlines())
    submissions = {"ana": {"sdpa": HONEST_A}, "ben": {"sdpa": RENAMED}, "chen": {"sdpa": HONEST_B},
                   "dara": {"sdpa": pasted}}
    rows = similarity.near_copies(submissions, references)
    pairs = {(who, whom) for _, who, whom, _ in rows}
    assert ("dara", similarity.REFERENCE) in pairs                     # the reference, pasted
    assert ("ana", "ben") in pairs                                     # a copy with renamed variables
    assert ("ana", "chen") not in pairs and ("chen", similarity.REFERENCE) not in pairs   # honest and independent
    scores = {(who, whom): s for _, who, whom, s in rows}
    assert scores[("ana", "ben")] == 1.0                               # renaming and layout change nothing
    # the honest pairs share about a quarter of their fingerprints (0.21 to 0.26 when this was written)
    honest = [(HONEST_A, HONEST_B), (HONEST_B, references["sdpa"]), (HONEST_A, references["sdpa"])]
    assert all(similarity.similarity(similarity.fingerprints(x), similarity.fingerprints(y)) < 0.5 for x, y in honest)


def test_a_short_exercise_is_not_a_list_of_false_alarms():
    """Two honest three-line masks look alike: too few fingerprints to tell, so never listed."""
    mask_a = "def causal_mask(n, device=None):\n    return torch.ones(n, n, dtype=torch.bool, device=device).tril()\n"
    mask_b = "def causal_mask(n, device=None):\n    m = torch.ones(n, n, device=device, dtype=torch.bool)\n    return m.tril()\n"
    assert similarity.near_copies({"a": {"causal_mask": mask_a}, "b": {"causal_mask": mask_b}}, {}) == []


def test_the_near_copy_report_speaks_the_instructors_language():
    from attncourse.i18n import set_language
    rows = [("sdpa", "alice", similarity.REFERENCE, 1.0), ("causal_mask", "bob", "carol", 0.875)]
    assert similarity.describe("ch02", rows) == [
        "2 near-copies (similarity_ch02.csv), to read before releasing grades:",
        "  sdpa: alice ~ the reference solution (100% of the shorter solution's fingerprints shared)",
        "  causal_mask: bob ~ carol (88% of the shorter solution's fingerprints shared)"]
    set_language("zh")
    try:
        assert similarity.describe("ch02", rows) == [
            "2 对近似抄袭（见 similarity_ch02.csv），发布成绩前请先核查：",
            "  sdpa：alice ~ 参考解答（较短一方的指纹有 100% 相同）",
            "  causal_mask：bob ~ carol（较短一方的指纹有 88% 相同）"]
    finally:
        set_language("en")
    assert similarity.describe("ch02", []) == []
