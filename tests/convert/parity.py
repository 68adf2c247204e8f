"""Helpers for the HF parity tests: inputs with padding and two segments, and the comparison."""

import json
import os

import numpy as np
import torch

import lmsuite.convert as convert

TOL = 1e-4


def make_inputs(*, vocab_size: int, batch: int = 3, length: int = 11, seed: int = 0, types=2):
    """Random ids; example 1 is right-padded after 7 tokens, example 2 after 4; two segments."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, size=(batch, length)).astype(np.int64)
    mask = np.ones((batch, length), np.int64)
    if batch > 1:
        mask[1, 7:] = 0
    if batch > 2:
        mask[2, 4:] = 0
    ids = np.where(mask == 1, ids, 0)
    token_types = None
    if types > 1:
        token_types = np.zeros((batch, length), np.int64)
        token_types[:, length // 2 :] = 1
        token_types = token_types * mask
    return ids, mask, token_types


def hf_forward(hf_model, **inputs):
    with torch.no_grad():
        kwargs = {k: torch.from_numpy(v) for k, v in inputs.items() if v is not None}
        return hf_model(**kwargs)


def max_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)))


def assert_close(ours, theirs, what: str, tol: float = TOL):
    """Asserts max-abs-diff <= tol; with $LMSUITE_PARITY_LOG set, appends the figure there."""
    d = max_diff(ours, theirs)
    log = os.environ.get("LMSUITE_PARITY_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(log, "a") as f:
            f.write(json.dumps({"test": test, "what": what, "max_abs_diff": d}) + "\n")
    assert d <= tol, f"{what}: max-abs-diff {d:.3g} > {tol}"
    return d


def roundtrip(converted, hf_class: str, tmp_path):
    """to_hf then transformers' from_pretrained; returns the reloaded HF model."""
    import transformers

    out = convert.to_hf(converted.config, converted.params, str(tmp_path), hf_class=hf_class)
    return getattr(transformers, hf_class).from_pretrained(out).eval()
