"""Helpers for the HF parity tests: inputs with padding and two segments, and the comparison."""

import dataclasses
import json
import os

import numpy as np
import torch

import lmsuite.convert as convert

TOL = 1e-4

# bfloat16 keeps 8 significant bits, so each rounding is off by up to u = 2**-8 of the value.
# A 2-5 layer test model rounds its activations some dozens of times in sequence (projections,
# residual adds, activations, the head); independent errors grow like the square root of their
# number, ~6-8u of the largest logit. Measured with the f32 HF model as reference: 2.3u (BERT,
# GPT-2), 4.4u (T5 1.0) and 6.2u (T5 1.1, logits up to 25). Weights off by N(0, 0.01^2) noise
# move them by 55u-155u, so the bound below still tells a wrong model from rounding.
BF16_REL_TOL = 16 * 2**-8


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


def at_bf16(converted):
    """The same converted model, float32 parameters, computing in bfloat16."""
    return dataclasses.replace(converted, config=converted.config.replace(dtype="bfloat16"))


def assert_bf16_close(ours, theirs, what: str, *, wrong, dtype: str = "bfloat16"):
    """Logits `ours` of a model computing in bfloat16 (of `dtype`: a pooled classifier's are
    float32, `heads.Classifier`) within BF16_REL_TOL of the largest f32 reference logit, while
    `wrong` (the same logits of a model with slightly perturbed weights) is not."""
    assert np.asarray(ours).dtype.name == dtype, np.asarray(ours).dtype
    tol = BF16_REL_TOL * float(np.max(np.abs(np.asarray(theirs, np.float64))))
    off = max_diff(wrong, theirs)
    assert off > 2 * tol, f"{what}: a perturbed model is only {off:.3g} off, tol {tol:.3g}"
    assert max_diff(ours, theirs) > 0, f"{what}: bfloat16 logits equal float32's exactly"
    return assert_close(ours, theirs, what, tol=tol)
