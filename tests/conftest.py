"""Suite-wide settings: rank promotion raises (STYLE rule 11); CPU only."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
