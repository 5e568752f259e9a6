"""Small fixed layers used to exercise learners' property checks (e.g. permutation equivariance)."""
import torch


def make_layer(kind, weight):
    """A layer [..., N, D] -> [..., N, D] built from a [D, D] weight.

    'linear' and 'attention' are permutation-equivariant; 'causal' and 'cumsum' see order.
    """
    if kind == "linear":
        return lambda x: x @ weight
    if kind == "attention":
        return lambda x: torch.nn.functional.scaled_dot_product_attention(x @ weight, x, x)
    if kind == "causal":
        return lambda x: torch.nn.functional.scaled_dot_product_attention(x @ weight, x, x, is_causal=True)
    if kind == "cumsum":
        return lambda x: (x @ weight).cumsum(dim=-2)
    raise ValueError(f"unknown layer kind {kind!r}")
