"""ELECTRA's joint model: the generator's size, the shared embeddings, sampling without a
gradient, the corrupted input, the discriminator as a plain Transformer, the paper's parameter
counts and one sharded train step."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from lmsuite import cli, partitioning
from lmsuite.models import Transformer, electra, summary
from lmsuite.models.config import ModelConfig
from lmsuite.models.option_groups import ElectraOptions
from lmsuite.objectives.electra import electra as electra_loss
from lmsuite.training import step
from lmsuite.training.train_state import create_sharded_state
from tests.training.tiny import mlm_batch

JOINT = ["ModelConfig.heads = ('mlm', 'rtd')", "ModelConfig.electra = @ElectraOptions()"]

needs_8 = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
)


def _tiny(**changes):
    config = cli.model_config_from_gin(["models/electra_tiny.gin"])
    return config.replace(dropout_rate=0.0, attention_dropout_rate=0.0, **changes)


def _batch(seed=0):
    batch = mlm_batch(seed=seed)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _inputs(batch):
    return electra_loss().model_inputs(batch)


def _params(config, batch):
    variables = Transformer(config).init(jax.random.PRNGKey(0), **_inputs(batch))
    return nn.unbox(variables["params"])


def _apply(config, params, batch, key=1, **kwargs):
    return Transformer(config).apply(
        {"params": params}, **_inputs(batch), rngs={"sample": jax.random.PRNGKey(key)}, **kwargs
    )


def _flat(tree):
    return traverse_util.flatten_dict(tree, sep="/")


# ------------------------------------------------------------------------------- sizes
def test_the_generator_is_the_configured_fraction_of_the_discriminator():
    tiny = electra.generator_config(_tiny())
    assert (tiny.d_model, tiny.num_heads, tiny.d_ff, tiny.num_layers) == (16, 1, 32, 2)
    assert tiny.embedding_dim == 32 and tiny.heads == ("mlm",) and tiny.electra is None
    params = _params(_tiny(), _batch())
    assert _flat(params)["generator/encoder/layers_0/mlp/wi/kernel"].shape == (16, 32)
    assert _flat(params)["discriminator/encoder/layers_0/mlp/wi/kernel"].shape == (64, 128)
    # ELECTRA-Base at 1/3 (configure_pretraining.py: 0.33333): the reference's D 256, 4 heads
    # (256 // 64), F 1024 (4 x 256), 12 layers.
    base = cli.model_config_from_gin(
        ["models/electra_base_discriminator.gin"],
        JOINT + ["ElectraOptions.generator_hidden_fraction = 0.33333"],
    )
    gen = electra.generator_config(base)
    assert (gen.d_model, gen.num_heads, gen.d_ff, gen.num_layers) == (256, 4, 1024, 12)
    half = electra.generator_config(_tiny(electra=ElectraOptions(generator_layer_fraction=0.5)))
    assert half.num_layers == 1


@pytest.mark.parametrize("size, fraction, millions", [("small", 0.25, 14), ("base", 0.33333, 110)])
def test_the_discriminator_has_the_papers_parameter_count(size, fraction, millions):
    config = cli.model_config_from_gin(
        [f"models/electra_{size}_discriminator.gin"],
        JOINT + [f"ElectraOptions.generator_hidden_fraction = {fraction}"],
    )
    joint = summary.summarize(config)
    disc = summary.summarize(electra.discriminator_config(config))["total"]
    # The paper (Table 1 and 8) rounds to two significant figures: 14M, 110M.
    assert float(f"{disc / 1e6:.2g}") == millions, disc
    shared = joint["per_module"]["token_embedder"] + joint["per_module"]["embedder"]
    assert disc == shared + joint["per_module"]["discriminator"]
    assert joint["total"] == disc + joint["per_module"]["generator"]


def test_options_round_trip_through_json_and_bad_ones_are_named():
    config = _tiny(electra=ElectraOptions(generator_hidden_fraction=0.5, temperature=2.0))
    assert ModelConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match=r"generator_hidden_fraction must lie in \(0, 1\], got 0"):
        ElectraOptions(generator_hidden_fraction=0)
    with pytest.raises(ValueError, match="heads=\\('mlm', 'rtd'\\).*\\('rtd',\\)"):
        _tiny(heads=("rtd",))
    # A family's module takes only its own inputs: a plain encoder has no masked_weights.
    with pytest.raises(TypeError, match="unexpected keyword argument 'masked_weights'"):
        plain = electra.discriminator_config(_tiny())
        ids = jnp.ones((1, 4), jnp.int32)
        Transformer(plain).init(jax.random.PRNGKey(0), ids, masked_weights=jnp.ones((1, 1)))


# --------------------------------------------------------------------- the shared layer
def test_shared_embeddings_are_one_array_that_both_towers_read():
    config, batch = _tiny(), _batch()
    params = _params(config, batch)
    assert sorted(params) == ["discriminator", "embedder", "generator", "token_embedder"]
    assert not any("token_embedder" in k or "position_embedder" in k for k in _flat(params)
                   if k.startswith(("generator/", "discriminator/")))  # fmt: skip
    base = _apply(config, params, batch)
    for path in ("token_embedder/embedding", "embedder/position_embedder/embedding"):
        flat = _flat(params)
        flat[path] = flat[path] + 0.5
        moved = _apply(config, traverse_util.unflatten_dict(flat, sep="/"), batch)
        assert not np.allclose(moved["mlm_logits"], base["mlm_logits"]), path
        assert not np.allclose(moved["rtd_logits"], base["rtd_logits"]), path
    # A discriminator-only parameter leaves the generator and its samples alone.
    flat = _flat(params)
    flat["discriminator/rtd_head/output/bias"] = flat["discriminator/rtd_head/output/bias"] + 1
    moved = _apply(config, traverse_util.unflatten_dict(flat, sep="/"), batch)
    np.testing.assert_array_equal(moved["mlm_logits"], base["mlm_logits"])
    np.testing.assert_allclose(moved["rtd_logits"], base["rtd_logits"] + 1, rtol=1e-5, atol=1e-5)


def test_no_gradient_flows_from_the_discriminator_into_the_generator():
    config, batch = _tiny(), _batch()
    params = _params(config, batch)

    def grads(output):
        return _flat(jax.grad(lambda p: jnp.sum(jnp.sin(_apply(config, p, batch)[output])))(params))

    def norm(flat, prefix):
        return sum(float(jnp.sum(jnp.abs(g))) for k, g in flat.items() if k.startswith(prefix))

    rtd, mlm = grads("rtd_logits"), grads("mlm_logits")
    assert norm(rtd, "generator/") == 0.0
    assert norm(rtd, "discriminator/") > 0 and norm(rtd, "token_embedder/") > 0
    assert norm(rtd, "embedder/") > 0
    assert norm(mlm, "discriminator/") == 0.0
    assert norm(mlm, "generator/") > 0 and norm(mlm, "token_embedder/") > 0


# ---------------------------------------------------------------------------- sampling
def test_sampling_with_a_fixed_key_is_reproducible():
    config, batch = _tiny(), _batch()
    params = _params(config, batch)
    first, again = _apply(config, params, batch, key=3), _apply(config, params, batch, key=3)
    other = _apply(config, params, batch, key=4)
    np.testing.assert_array_equal(first["sampled_ids"], again["sampled_ids"])
    assert not np.array_equal(first["sampled_ids"], other["sampled_ids"])
    with pytest.raises(ValueError, match="rngs=\\{'sample': key\\}"):
        Transformer(config).apply({"params": params}, **_inputs(batch))


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_samples_follow_the_softmax_of_the_logits(temperature):
    logits = jnp.array([2.0, 1.0, 0.0, -1.0, 3.0])
    draws = 40000
    tiled = jnp.broadcast_to(logits, (draws, 1, 5))
    ids = electra.sample_ids(jax.random.PRNGKey(0), tiled, temperature=temperature)
    freq = np.bincount(np.asarray(ids).ravel(), minlength=5) / draws
    p = np.asarray(jax.nn.softmax(logits / temperature))
    sigma = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(freq - p) < 5 * sigma), (freq, p)


def test_sampling_does_not_differentiate():
    logits = jnp.array([[[0.3, 0.1, 2.0]]])
    g = jax.grad(lambda x: jnp.sum(electra.sample_ids(jax.random.PRNGKey(0), x) * 1.0))(logits)
    np.testing.assert_array_equal(g, 0.0)


def test_the_discriminator_reads_the_samples_at_the_real_predictions_only():
    config = _tiny()
    ids = jnp.array([[2, 4, 7, 4, 9, 3]], jnp.int32)
    batch = {
        "input_ids": ids,
        "input_mask": jnp.ones_like(ids),
        "token_type_ids": jnp.zeros_like(ids),
        "masked_positions": jnp.array([[1, 3, 0]], jnp.int32),  # slot 2 is padding
        "masked_ids": jnp.array([[8, 9, 0]], jnp.int32),
        "masked_weights": jnp.array([[1.0, 1.0, 0.0]]),
    }
    params = _params(config, batch)
    out = _apply(config, params, batch)
    corrupted, sampled = np.asarray(out["corrupted_ids"]), np.asarray(out["sampled_ids"])
    np.testing.assert_array_equal(corrupted[0, [0, 2, 4, 5]], [2, 7, 9, 3])  # [CLS] kept
    np.testing.assert_array_equal(corrupted[0, [1, 3]], sampled[0, :2])


def test_the_discriminator_alone_is_a_plain_transformer():
    config, batch = _tiny(), _batch()
    params = _params(config, batch)
    plain = Transformer(electra.discriminator_config(config))
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids")}
    inputs["attention_mask"] = batch["input_mask"]
    joint = Transformer(config).apply({"params": params}, **inputs)  # nothing replaced
    alone = plain.apply({"params": electra.discriminator_params(params)}, **inputs)
    np.testing.assert_allclose(alone["rtd_logits"], joint["rtd_logits"], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- the step
def _mesh_step(config, params, batch, mesh):
    model, objective = Transformer(config), electra_loss()
    abstract = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), **objective.model_inputs(batch))["params"]
    )
    state, shardings, _ = create_sharded_state(
        init_params=lambda rng: jax.tree.map(
            lambda box, value: box.replace_boxed(value),
            abstract,
            jax.tree.map(np.asarray, params),
            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
        ),
        tx=optax.sgd(1.0),
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
    )
    batch_sharding = step.batch_shardings(batch, mesh, rules=partitioning.DEFAULT_RULES)
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=lambda s: 1.0,
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
    )
    new, metrics = run(state, jax.device_put(batch, batch_sharding), jax.random.PRNGKey(5))
    return jax.tree.map(np.asarray, (new.params, metrics))


@needs_8
def test_one_jitted_train_step_on_a_data_fsdp_tensor_mesh_matches_one_device():
    # Half width: the generator's 2 heads split over tensor=2 (ELECTRA-Small's has one head, so
    # its runs keep tensor=1; preflight names the parameters that do not divide).
    config = _tiny(electra=ElectraOptions(generator_hidden_fraction=0.5))
    batch = jax.tree.map(np.asarray, _batch())
    params = _params(config, batch)
    one = _mesh_step(config, params, batch, partitioning.make_mesh(devices=jax.devices()[:1]))
    eight = _mesh_step(config, params, batch, partitioning.make_mesh(data=2, fsdp=2, tensor=2))
    for name in ("loss", "mlm_loss", "rtd_loss", "replaced_fraction"):
        assert np.isfinite(eight[1][name]), name
        np.testing.assert_allclose(eight[1][name], one[1][name], rtol=1e-5, err_msg=name)
    assert eight[1]["replaced_fraction"] > 0
    for (path, new), old in zip(_flat(eight[0]).items(), _flat(params).values(), strict=True):
        np.testing.assert_allclose(
            new - old, _flat(one[0])[path] - old, rtol=1e-3, atol=1e-6, err_msg=path
        )
