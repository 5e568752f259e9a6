"""Unit tests of the chapter 04 reference (positional encoding), with hypothesis for RoPE's properties."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncourse_ref import positional as ref


def test_sinusoidal_table_formula():
    pe = ref.sinusoidal_table(50, 16)
    assert pe.shape == (50, 16) and pe.dtype == torch.float64
    for pos in (0, 1, 7, 49):
        for i in range(8):
            w = 1 / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos * w), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w), abs=1e-12)
    assert pe.abs().max() <= 1


@given(k=st.integers(0, 60), half_d=st.integers(1, 16))
@settings(max_examples=40, deadline=None)
def test_shift_matrix_shifts_every_position(k, half_d):
    d = 2 * half_d
    pe = ref.sinusoidal_table(k + 80, d)
    m = ref.shift_matrix(k, d)
    torch.testing.assert_close(pe[:80] @ m.T, pe[k:k + 80], atol=1e-12, rtol=0)
    torch.testing.assert_close(m.T @ m, torch.eye(d, dtype=torch.float64), atol=1e-12, rtol=0)


def test_learned_positional_embedding():
    emb = ref.LearnedPositionalEmbedding(7, 3)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(emb(x), x + emb.embedding.weight[:5])


rope_inputs = dict(half_d=st.integers(1, 8), m=st.integers(0, 500), n=st.integers(0, 500),
                   shift=st.integers(0, 500), seed=st.integers(0, 2**31 - 1))


@given(**rope_inputs)
@settings(max_examples=60, deadline=None)
def test_rope_preserves_norms_and_is_relative(half_d, m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    d = 2 * half_d
    q, k = torch.randn(1, d, generator=g, dtype=torch.float64), torch.randn(1, d, generator=g, dtype=torch.float64)
    qm = ref.apply_rope(q, torch.tensor([m]))
    assert qm.norm().item() == pytest.approx(q.norm().item(), rel=1e-12)
    dot = (qm * ref.apply_rope(k, torch.tensor([n]))).sum()
    shifted = (ref.apply_rope(q, torch.tensor([m + shift])) * ref.apply_rope(k, torch.tensor([n + shift]))).sum()
    assert dot.item() == pytest.approx(shifted.item(), abs=1e-9)


def test_rope_position_zero_is_identity_and_matches_rotation():
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(ref.apply_rope(x, torch.zeros(4, dtype=torch.long)), x)
    y = ref.apply_rope(x, torch.tensor([0, 1, 2, 3]))
    a = 3 * 1.0                                         # pair 0 of position 3 turns by 3 * w_0 = 3
    torch.testing.assert_close(y[..., 3, 0], x[..., 3, 0] * math.cos(a) - x[..., 3, 1] * math.sin(a))
    assert ref.apply_rope(x.float(), torch.arange(4)).dtype == torch.float32


def test_relative_position_index_and_bias():
    idx = ref.relative_position_index(3, 5)
    assert idx.dtype == torch.int64 and idx.min() >= 0 and idx.max() <= 8
    assert idx[2, 0] == 2 + 4 and idx[0, 2] == -2 + 4
    rb = ref.RelativePositionBias(5, 2).double()      # float64: (s + b) - s is then exact enough
    s = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    out = rb(s)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                assert torch.allclose(out[:, h, i, j] - s[:, h, i, j], rb.table[i - j + 4, h])


# ---- RoPE past the trained length: position interpolation, NTK-aware scaling, YaRN ----
@pytest.mark.parametrize("d, factor, original, base", [(64, 4.0, 2048, 1e4), (128, 8.0, 4096, 5e5), (16, 2.0, 64, 1e4),
                                                       (32, 16.0, 128, 1e4), (8, 1.5, 32, 100.0)])
def test_scaled_frequencies_match_hugging_face(d, factor, original, base):
    """Against transformers' own implementations (its 'linear' is position interpolation)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    yarn = LlamaConfig(hidden_size=2 * d, num_attention_heads=2, max_position_embeddings=int(original * factor),
                       rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                        "original_max_position_embeddings": original})
    theirs, their_scale = ROPE_INIT_FUNCTIONS["yarn"](yarn, "cpu")
    ours, scale = ref.yarn_inv_freq(d, factor, original, base)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=0)       # theirs is float32
    assert scale == pytest.approx(their_scale, rel=1e-12)
    linear = LlamaConfig(hidden_size=2 * d, num_attention_heads=2,
                         rope_parameters={"rope_type": "linear", "rope_theta": base, "factor": factor})
    theirs, _ = ROPE_INIT_FUNCTIONS["linear"](linear, "cpu")
    torch.testing.assert_close(ref.interpolated_inv_freq(d, factor, base), theirs.double(), rtol=1e-6, atol=0)


@given(half_d=st.integers(2, 64), factor=st.floats(1.0, 64.0), base=st.sampled_from([100.0, 1e4, 5e5]))
@settings(max_examples=60, deadline=None)
def test_ntk_scaling_keeps_the_fastest_pair_and_slows_the_slowest_by_the_factor(half_d, factor, base):
    d = 2 * half_d
    w, ntk = ref.rope_inv_freq(d, base), ref.ntk_inv_freq(d, factor, base)
    assert ntk[0].item() == pytest.approx(w[0].item(), rel=1e-12)
    assert ntk[-1].item() == pytest.approx(w[-1].item() / factor, rel=1e-9)
    ratio = w / ntk                                   # how much each pair is slowed: from 1 up to the factor
    assert bool((ratio[1:] >= ratio[:-1] * (1 - 1e-12)).all()) and bool((ratio <= factor * (1 + 1e-9)).all())


@given(half_d=st.integers(4, 64), factor=st.floats(1.0, 64.0), original=st.integers(16, 8192))
@settings(max_examples=60, deadline=None)
def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between(half_d, factor, original):
    d, base = 2 * half_d, 1e4
    w = ref.rope_inv_freq(d, base)
    ours, scale = ref.yarn_inv_freq(d, factor, original, base)
    turns = original * w / (2 * math.pi)              # how many times each pair turns over the trained length
    fast, slow = turns > 33, turns < 0.5               # beyond the ramp's ends, with a margin for its rounding
    torch.testing.assert_close(ours[fast], w[fast], rtol=1e-12, atol=0)
    torch.testing.assert_close(ours[slow], w[slow] / factor, rtol=1e-12, atol=0)
    ratio = w / ours
    assert bool((ratio >= 1 - 1e-12).all()) and bool((ratio <= factor * (1 + 1e-12)).all())
    assert bool((ratio[1:] >= ratio[:-1] * (1 - 1e-12)).all())          # slower pairs are interpolated more
    assert scale == pytest.approx(1 + 0.1 * math.log(factor) if factor > 1 else 1.0)
