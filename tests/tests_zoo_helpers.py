"""Small wrong implementations used by tests that are not about the zoo itself."""
import torch


def wrong_sdpa(q, k, v, mask=None):
    """No scaling: wrong for every d_k > 1."""
    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return w @ v, w
