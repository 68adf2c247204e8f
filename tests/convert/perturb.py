"""Random HF weights everywhere, so that parity tests see every parameter.

HF initialises LayerNorm scales to 1 and biases to 0: a converter that swapped a norm's scale and
bias, or dropped a bias, would still match on a freshly built model. `perturb` adds noise to
every parameter (tied parameters are one tensor, so ties survive).
"""

import torch


def perturb(hf_model, *, seed: int = 0, scale: float = 0.1):
    """Adds N(0, scale^2) noise to every parameter of `hf_model` in place; returns it."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return hf_model.eval()
