"""The papers' optimizers, assembled from Optax pieces.

- `adamw`: Adam with decoupled weight decay; LayerNorm parameters and biases are not decayed,
  except XLNet's relative-attention biases (`DECAY_INCLUDE_PATTERN`); with
  `bias_correction=False` it is TF BERT's `AdamWeightDecayOptimizer` (m / (sqrt(v) + eps)).
- `lamb`: LAMB as ALBERT's `lamb_optimizer.py` runs it: weight decay *and* the layer-wise trust
  ratio are both masked, so LayerNorm parameters and biases take plain Adam steps.
- `adafactor`: T5's Adafactor (factored second moments, decay 0.8, update clipping 1.0,
  parameter-scaled steps).

Each is preceded by global-norm gradient clipping when `clip_norm` is set.
"""

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "lamb", "adafactor", "sgd")
# ALBERT's default LAMB learning rate (batch 4096, `run_pretraining.py --learning_rate`).
ALBERT_LAMB_LEARNING_RATE = 0.00176
# A parameter whose tree path matches this is a LayerNorm/RMSNorm parameter or a bias: any name
# ending in "bias", as the TF references match "bias" anywhere in a variable's name (BERT's,
# ALBERT's and XLNet's exclude_from_weight_decay = ["LayerNorm", "layer_norm", "bias"]).
NO_DECAY_PATTERN = r"(^|/)[^/]*(norm|LayerNorm|layer_norm)[^/]*(/|$)|bias$"
# Checked before NO_DECAY_PATTERN: these are decayed although their names end in "bias". XLNet's
# AdamWeightDecayOptimizer (zihangdai/xlnet model_utils.py, `_do_use_weight_decay`) tests its
# include_in_weight_decay = ["r_s_bias", "r_r_bias", "r_w_bias"] first, so the relative-attention
# biases u, v and the segment bias take weight decay; lmsuite names them content_bias,
# position_bias and segment_bias (the r_* names are the reference's and HuggingFace's).
DECAY_INCLUDE_PATTERN = r"(^|/)(content_bias|position_bias|segment_bias|r_[wrs]_bias)$"


def _path_string(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def takes_decay(
    path: str, *, exclude: str = NO_DECAY_PATTERN, include: str = DECAY_INCLUDE_PATTERN
) -> bool:
    """Whether the parameter at "/"-joined `path` is decayed: `include` first, then `exclude`.

    Example: "layers_0/attention/content_bias" -> True, "layers_0/mlp/wi/bias" -> False.
    """
    if re.search(include, path, flags=re.IGNORECASE):
        return True
    return re.search(exclude, path, flags=re.IGNORECASE) is None


def decay_mask(
    params: Any, *, exclude: str = NO_DECAY_PATTERN, include: str = DECAY_INCLUDE_PATTERN
) -> Any:
    """True for every parameter that takes weight decay and the trust ratio.

    Example: {"layers_0": {"attention_norm": {"scale": w1, "bias": w2},
              "attention": {"content_bias": w3}, "mlp": {"wi": {"kernel": w4, "bias": w5}}}}
      -> {"layers_0": {"attention_norm": {"scale": False, "bias": False},
          "attention": {"content_bias": True}, "mlp": {"wi": {"kernel": True, "bias": False}}}}
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: takes_decay(_path_string(path), exclude=exclude, include=include), params
    )


def scale_by_adam_moments(
    *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, bias_correction: bool = True
) -> optax.GradientTransformation:
    """Adam's direction m / (sqrt(v) + eps), with or without bias correction of m and v.

    For a constant gradient g the step without correction is (1 - b1^t) / sqrt(1 - b2^t) times
    the corrected one (3.16228 at t=1, 6.5685 at t=12 with b1=0.9, b2=0.999), which is why
    BERT-style training needs warmup.
    """
    if bias_correction:
        return optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

    def init_fn(params):
        return optax.ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            nu=optax.tree.zeros_like(params),
        )

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        count = optax.safe_increment(state.count)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def adamw(
    *,
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = True,
    mask: Callable[[Any], Any] = decay_mask,
) -> optax.GradientTransformation:
    """AdamW with LayerNorm parameters and biases (not XLNet's r_*_bias) excluded from decay."""
    return optax.chain(
        scale_by_adam_moments(b1=b1, b2=b2, eps=eps, bias_correction=bias_correction),
        optax.add_decayed_weights(weight_decay, mask=mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def lamb(
    *,
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = False,
    mask: Callable[[Any], Any] = decay_mask,
) -> optax.GradientTransformation:
    """ALBERT's LAMB: masked decay and masked trust ratio ||w|| / ||adam + wd * w||.

    For every adapted variable the step norm is exactly `lr * ||w||` (when both norms are
    non-zero); masked variables take `lr * m / (sqrt(v) + eps)`. ALBERT's implementation has no
    bias correction, hence the default.
    """
    return optax.chain(
        scale_by_adam_moments(b1=b1, b2=b2, eps=eps, bias_correction=bias_correction),
        optax.add_decayed_weights(weight_decay, mask=mask),
        optax.masked(optax.scale_by_trust_ratio(), mask),
        optax.scale_by_learning_rate(learning_rate),
    )


# An attention projection's output module: its kernel is (H, K, D), the others' (D, H, K).
_HEADS_FIRST = re.compile(r"(^|/)(out|o|output)/kernel$")


def matrix_shape(path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape Adafactor factors a parameter as: an attention kernel's head and per-head
    dims merged, as T5 stores it ((D, H, K) -> (D, H*K); an output projection's (H, K, D) ->
    (H*K, D)); any other parameter as it is. A leading dim beyond those (a scanned stack's
    layers) is kept.

    Example: ("layers_0/attention/query/kernel", (768, 12, 64)) -> (768, 768);
             ("layers_0/attention/out/kernel", (12, 64, 768)) -> (768, 768).
    """
    if len(shape) < 3 or not path.endswith("kernel"):
        return tuple(shape)
    if _HEADS_FIRST.search(path):
        *lead, heads, width, d_model = shape
        return (*lead, heads * width, d_model)
    *lead, d_model, heads, width = shape
    return (*lead, d_model, heads * width)


def factored_as_matrices(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` run on every parameter in its `matrix_shape`, the updates reshaped back.

    Optax's Adafactor factors the two largest dims of a parameter when the second is >= 128;
    on lmsuite's (D, H, K) attention kernels that is K (64 in every base model), so they would
    get a full second moment, not the factored one the reference's (D, H*K) kernels get (about
    40% of T5 1.1 base's non-embedding parameters). Viewed as matrices, every kernel T5 factors
    is factored. A reshape of a contiguous array moves nothing.
    """

    def view(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, x: x.reshape(matrix_shape(_path_string(path), x.shape)), tree
        )

    def init_fn(params):
        return inner.init(view(params))

    def update_fn(updates, state, params=None):
        shapes = jax.tree.map(lambda u: u.shape, updates)
        new, state = inner.update(view(updates), state, None if params is None else view(params))
        return jax.tree.map(lambda u, shape: u.reshape(shape), new, shapes), state

    return optax.GradientTransformation(init_fn, update_fn)


def adafactor(
    *,
    learning_rate: optax.ScalarOrSchedule,
    decay_rate: float = 0.8,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    min_dim_size_to_factor: int = 128,
) -> optax.GradientTransformation:
    """T5's Adafactor: Optax's implementation with T5's defaults, on every parameter viewed as
    the matrix T5 stores (`factored_as_matrices`)."""
    return factored_as_matrices(
        optax.adafactor(
            learning_rate=learning_rate,
            decay_rate=decay_rate,
            clipping_threshold=clipping_threshold,
            multiply_by_parameter_scale=multiply_by_parameter_scale,
            min_dim_size_to_factor=min_dim_size_to_factor,
        )
    )


def make_optimizer(
    *,
    name: str,
    learning_rate: optax.ScalarOrSchedule,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    bias_correction: bool | None = None,
) -> optax.GradientTransformation:
    """One of `OPTIMIZERS` by name, after global-norm clipping to `clip_norm` (None: none).

    `bias_correction=None` takes each optimizer's paper default (AdamW: True, LAMB: False).
    """
    if name == "adamw":
        core = adamw(
            learning_rate=learning_rate,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=True if bias_correction is None else bias_correction,
        )
    elif name == "lamb":
        core = lamb(
            learning_rate=learning_rate,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=False if bias_correction is None else bias_correction,
        )
    elif name == "adafactor":
        core = adafactor(learning_rate=learning_rate)
    elif name == "sgd":
        core = optax.sgd(learning_rate)
    else:
        raise ValueError(f"optimizer name must be one of {OPTIMIZERS}, got {name!r}")
    if clip_norm is None:
        return core
    if clip_norm <= 0:
        raise ValueError(f"clip_norm must be positive or None, got {clip_norm}")
    return optax.chain(optax.clip_by_global_norm(clip_norm), core)
