"""Adafactor factors every matrix T5's reference factors.

The reference is T5X's Adafactor (google-research/t5x `t5x/adafactor.py`), restated here from
its rules rather than imported (it needs the retired `flax.optim`): a parameter of rank <= 2 is
factored over its two largest dims when the second is >= 128 (`_factored_dims`); a higher-rank
one follows `standard_logical_factor_rules` over its logical axis names, its ROW dims (embed)
against its COLUMN dims (heads, kv, mlp, vocab), so v_row drops the COLUMN dims and v_col the
ROW dims (`init_param_state`).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from lmsuite.cli import model_config_from_gin
from lmsuite.models.summary import abstract_variables
from lmsuite.training import optimizers

_T5X_ROW = {"embed"}
_T5X_COLUMN = {"vocab", "mlp", "heads", "kv", "joined_kv"}


def _t5x_statistics(shape, names) -> tuple[int, int] | None:
    """(v_row size, v_col size) sorted, or None for an unfactored second moment."""
    if len(shape) <= 2:
        if len(shape) < 2 or sorted(shape)[-2] < 128:
            return None
        order = np.argsort(shape)
        row, col = int(order[-2]), int(order[-1])
        v_row = math.prod(np.delete(shape, col))
        v_col = math.prod(np.delete(shape, row))
        return tuple(sorted((int(v_row), int(v_col))))
    rows = [d for d, n in enumerate(names) if n in _T5X_ROW]
    cols = [d for d, n in enumerate(names) if n in _T5X_COLUMN]
    assert rows and cols, (shape, names)  # every 3-D kernel of T5 has both
    v_row = math.prod(np.delete(shape, cols))
    v_col = math.prod(np.delete(shape, rows))
    return tuple(sorted((int(v_row), int(v_col))))


def _lmsuite_statistics(state) -> dict[str, tuple[int, int] | None]:
    """Per parameter path: (v_row size, v_col size) sorted, or None where Optax keeps a full v."""
    factored = next(s for s in jax.tree.leaves(state, is_leaf=_is_factored) if _is_factored(s))
    flat = {
        name: traverse_util.flatten_dict(getattr(factored, name), sep="/")
        for name in ("v_row", "v_col", "v")
    }
    out = {}
    for path, v in flat["v"].items():
        if math.prod(v.shape) > 1:
            out[path] = None
        else:
            sizes = math.prod(flat["v_row"][path].shape), math.prod(flat["v_col"][path].shape)
            out[path] = tuple(sorted(sizes))
    return out


def _is_factored(x) -> bool:
    return isinstance(x, optax.FactoredState)


def test_t5_1_1_base_state_is_factored_as_t5x_factors_it(capsys):
    config = model_config_from_gin(["models/t5_1_1_base.gin"])
    boxed = traverse_util.flatten_dict(
        abstract_variables(config)["params"],
        sep="/",
        is_leaf=lambda _, x: isinstance(x, nn.Partitioned),
    )
    params = {path: jnp.zeros(box.value.shape) for path, box in boxed.items()}
    tx = optimizers.make_optimizer(name="adafactor", learning_rate=1.0, clip_norm=None)
    ours = _lmsuite_statistics(jax.eval_shape(tx.init, traverse_util.unflatten_dict(params, "/")))
    reference = {path: _t5x_statistics(box.value.shape, box.names) for path, box in boxed.items()}
    with capsys.disabled():
        print(f"\n{'parameter':<52} {'shape':<16} {'T5X v_row/v_col':<16} lmsuite")
        for path in sorted(boxed):
            if "layers_" in path and not path.split("/")[1] == "layers_0":
                continue  # one layer of each stack shows them all
            print(
                f"{path:<52} {str(boxed[path].value.shape):<16} "
                f"{str(reference[path] or 'full v'):<16} {ours[path] or 'full v'}"
            )
    assert ours == reference
    kernels = [p for p, box in boxed.items() if len(box.value.shape) == 3]
    assert len(kernels) == 12 * 4 + 12 * 8  # encoder q/k/v/out, decoder self + cross
    assert all(ours[p] is not None for p in kernels)


def test_factored_as_matrices_is_adafactor_on_the_merged_matrix():
    """A (D, H, K) kernel's and an (H, K, D) kernel's updates are Adafactor's on (D, H*K) and
    (H*K, D), reshaped back; plain Optax on the 3-D arrays (K = 64 < 128: a full v) differs."""
    rng = np.random.default_rng(0)
    d, h, k = 256, 4, 64
    params = {
        "attention": {
            "query": {"kernel": jnp.asarray(rng.normal(size=(d, h, k)), jnp.float32)},
            "out": {"kernel": jnp.asarray(rng.normal(size=(h, k, d)), jnp.float32)},
        }
    }
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)]
    grads.append(jax.tree.map(lambda g: g * 3.0 + 1.0, grads[0]))
    flat = lambda tree: {
        "attention": {
            "query": {"kernel": tree["attention"]["query"]["kernel"].reshape(d, h * k)},
            "out": {"kernel": tree["attention"]["out"]["kernel"].reshape(h * k, d)},
        }
    }
    ours = optimizers.adafactor(learning_rate=0.01)
    reference = optax.adafactor(learning_rate=0.01, decay_rate=0.8, clipping_threshold=1.0)
    plain = optax.adafactor(learning_rate=0.01, decay_rate=0.8, clipping_threshold=1.0)
    states = ours.init(params), reference.init(flat(params)), plain.init(params)
    for g in grads:
        ours_update, s0 = ours.update(g, states[0], params)
        ref_update, s1 = reference.update(flat(g), states[1], flat(params))
        plain_update, s2 = plain.update(g, states[2], params)
        states = s0, s1, s2
        np.testing.assert_allclose(
            flat(ours_update)["attention"]["query"]["kernel"],
            ref_update["attention"]["query"]["kernel"],
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            flat(ours_update)["attention"]["out"]["kernel"],
            ref_update["attention"]["out"]["kernel"],
            rtol=1e-6,
        )
    difference = jnp.abs(
        ours_update["attention"]["query"]["kernel"] - plain_update["attention"]["query"]["kernel"]
    )
    assert float(difference.max()) > 1e-4


def test_matrix_shape_names_the_merged_dims():
    assert optimizers.matrix_shape("l/attention/query/kernel", (768, 12, 64)) == (768, 768)
    assert optimizers.matrix_shape("l/attention/out/kernel", (12, 64, 768)) == (768, 768)
    assert optimizers.matrix_shape("scan/attention/key/kernel", (6, 512, 8, 64)) == (6, 512, 512)
    assert optimizers.matrix_shape("l/mlp/wi/kernel", (768, 2048)) == (768, 2048)
    assert optimizers.matrix_shape("l/attention/query/bias", (12, 64)) == (12, 64)
