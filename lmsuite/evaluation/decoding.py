"""`generate`: greedy, sampled and beam-search decoding that returns what HF's `generate` does.

    tokens = generate(config, params, input_ids=ids, max_new_tokens=20, num_beams=3,
                      eos_token_id=2, pad_token_id=0)

The same arguments given to HF's `model.generate` (transformers 5.x, with the generation
options lmsuite does not implement neutral: no repetition penalty, bad words, ...) give the same
array, HF's logits processors for minimum lengths, repeated n-grams and forced BOS/EOS tokens
included (`logits_processing`). Decoder-only models return prompt + new tokens,
encoder-decoders return decoder start + new tokens; rows that stop early are padded with
`pad_token_id` (greedy, sampling) or with HF's fill value (beam search,
`beam_search.fill_value`), and the array ends where the longest returned row does. Sampling
draws from the same distributions as HF but with JAX's random numbers, so it is reproducible
for a seed, not equal to HF's draws.

Prompt handling follows HF: decoder-only prompts may be left-padded, with an attention_mask (or,
without one, a mask inferred from `pad_token_id` when that differs from the EOS ids); positions
count real tokens only (cumsum of the mask, padded positions 0). A prefix-LM's prompt is its
bidirectional prefix.

The prefill, every step and the stopping tests run in one jitted function around one
`jax.lax.while_loop`, with a key/value cache of the decoder (`families.init_cache`),
or, with `use_cache=False`, a full forward over the whole fixed-length buffer at each step
(causality makes the unwritten positions irrelevant), kept to test the cache against.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.evaluation import beam_search
from lmsuite.evaluation.logits_processing import process, warp
from lmsuite.models import families
from lmsuite.models.config import ModelConfig
from lmsuite.models.inputs import position_limit


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one decoding run (the key of its compiled function)."""

    config: ModelConfig
    prompt_length: int  # P: decoder prompt positions (1, the start token, for encoder-decoders)
    total_length: int  # T = P + max_new_tokens: the output buffer
    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    eos: tuple[int, ...] | None
    pad: int | None
    use_cache: bool
    min_new_tokens: int = 0
    no_repeat_ngram_size: int = 0
    forced_bos: int | None = None
    forced_eos: tuple[int, ...] | None = None


def generate(
    config: ModelConfig,
    params,
    *,
    input_ids,
    attention_mask=None,
    max_new_tokens: int,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    decoder_start_token_id: int | None = None,
    min_new_tokens: int = 0,
    no_repeat_ngram_size: int = 0,
    forced_bos_token_id: int | None = None,
    forced_eos_token_id: int | Sequence[int] | None = None,
    seed: int = 0,
    use_cache: bool = True,
) -> np.ndarray:
    """Generates up to `max_new_tokens` after each prompt; returns int64 (B, length).

    Args:
      input_ids: (B, S) prompts (decoder-only, left-padded) or encoder inputs.
      attention_mask: (B, S) 1 on real tokens.
      num_beams: 1 for greedy / sampling, more for beam search (HF's, including its
        `length_penalty` (scores are sum log p / generated_length ** length_penalty) and
        `early_stopping` (True, False or "never") heuristics).
      do_sample, temperature, top_k, top_p: sampling and its warpers, applied in HF's order;
        temperature, top_k and top_p are ignored without do_sample, as HF ignores them.
      eos_token_id: one id or several; None never stops before max_new_tokens (lmsuite
        configs carry no EOS id, so there is no default).
      pad_token_id: fills finished rows; None with an EOS id: the first EOS id, as HF.
      decoder_start_token_id: encoder-decoders only; None: config.decoder_start_id.
      min_new_tokens: the EOS ids score -inf until this many tokens are generated (HF's
        min_new_tokens; HF's min_length is min_new_tokens + the prompt length P).
      no_repeat_ngram_size: n > 0 bans every token that would repeat an n-gram of the
        sequence so far (the prompt or decoder start included, as HF).
      forced_bos_token_id: the only choice while one token is known (HF: cur_len == 1).
      forced_eos_token_id: one id or several, the only choice for the last new token.
      seed: of the sampling draws.
      use_cache: False recomputes the whole forward at every step.
    """
    _check_options(
        config,
        max_new_tokens=max_new_tokens,
        num_beams=num_beams,
        early_stopping=early_stopping,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_new_tokens=min_new_tokens,
        no_repeat_ngram_size=no_repeat_ngram_size,
    )
    input_ids = _int_array("input_ids", input_ids)
    if attention_mask is not None:
        attention_mask = _int_array("attention_mask", attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {input_ids.shape}, "
                f"got {attention_mask.shape}"
            )
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(
            f"input_ids holds id {hi if hi >= config.vocab_size else lo}, outside "
            f"[0, vocab_size={config.vocab_size})"
        )
    eos = _eos_ids("eos_token_id", eos_token_id, config.vocab_size)
    forced_eos = _eos_ids("forced_eos_token_id", forced_eos_token_id, config.vocab_size)
    for name, value in (
        ("pad_token_id", pad_token_id),
        ("decoder_start_token_id", decoder_start_token_id),
        ("forced_bos_token_id", forced_bos_token_id),
    ):
        if value is not None and not (_is_int(value, 0) and value < config.vocab_size):
            raise ValueError(
                f"{name} must be None or an id in [0, vocab_size={config.vocab_size}), "
                f"got {value!r}"
            )
    if pad_token_id is None and eos is not None:
        pad_token_id = eos[0]
    encoder_decoder = families.family(config).seq2seq
    batch, prompt_length = input_ids.shape
    if encoder_decoder:
        _check_positions(config, "encoder input_ids", prompt_length, 0)
        start = (
            config.decoder_start_id if decoder_start_token_id is None else decoder_start_token_id
        )
        decoder_prompt = np.full((batch, 1), start, np.int64)
        _check_positions(config, "decoder start token", 1, max_new_tokens)
    else:
        if decoder_start_token_id is not None:
            raise ValueError(
                f"decoder_start_token_id={decoder_start_token_id} is for encoder-decoder models, "
                f"not {families.describe(config)}"
            )
        _check_positions(config, "prompt", prompt_length, max_new_tokens)
        decoder_prompt = input_ids
        if attention_mask is None and pad_token_id is not None:
            attention_mask = _inferred_mask(input_ids, pad_token_id, eos)
    plan = Plan(
        config=config,
        prompt_length=decoder_prompt.shape[1],
        total_length=decoder_prompt.shape[1] + max_new_tokens,
        num_beams=num_beams,
        length_penalty=float(length_penalty),
        early_stopping=early_stopping,
        do_sample=bool(do_sample),
        temperature=float(temperature),
        top_k=int(top_k),
        top_p=float(top_p),
        eos=eos,
        pad=pad_token_id,
        use_cache=bool(use_cache),
        min_new_tokens=int(min_new_tokens),
        no_repeat_ngram_size=int(no_repeat_ngram_size),
        forced_bos=None if forced_bos_token_id is None else int(forced_bos_token_id),
        forced_eos=forced_eos,
    )
    inputs = _model_inputs(plan, decoder_prompt, input_ids, attention_mask)
    tokens_BT, lengths_B = _decode(plan, params, inputs, jax.random.PRNGKey(seed))
    return np.asarray(tokens_BT, np.int64)[:, : plan.prompt_length + int(np.max(lengths_B))]


# ----------------------------------------------------------------------------- validation
def _check_options(
    config,
    *,
    max_new_tokens,
    num_beams,
    early_stopping,
    temperature,
    top_k,
    top_p,
    min_new_tokens,
    no_repeat_ngram_size,
):
    if not families.family(config).can_generate(config):
        raise ValueError(
            f"cannot decode {families.describe(config)} with heads={config.heads!r}; generate "
            f"needs one of {families.decoding_architectures()} with an 'lm' head"
        )
    checks = (
        ("max_new_tokens", max_new_tokens, "an int >= 1", _is_int(max_new_tokens, 1)),
        ("num_beams", num_beams, "an int >= 1", _is_int(num_beams, 1)),
        ("top_k", top_k, "an int >= 0 (0: no top-k)", _is_int(top_k, 0)),
        ("min_new_tokens", min_new_tokens, "an int >= 0", _is_int(min_new_tokens, 0)),
        (
            "no_repeat_ngram_size",
            no_repeat_ngram_size,
            "an int >= 0 (0: no n-gram ban)",
            _is_int(no_repeat_ngram_size, 0),
        ),
        ("temperature", temperature, "a float > 0", temperature > 0),
        ("top_p", top_p, "a float in (0, 1]", 0 < top_p <= 1),
        (
            "early_stopping",
            early_stopping,
            'True, False or "never"',
            early_stopping is True or early_stopping is False or early_stopping == "never",
        ),
    )
    for name, value, expected, ok in checks:
        if not ok:
            raise ValueError(f"{name} must be {expected}, got {value!r}")


def _is_int(value, low: int) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= low


def _int_array(name: str, x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.integer) or x.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty (batch, length) integer array, got {x.dtype} {x.shape}"
        )
    return x


def _eos_ids(name: str, eos_token_id, vocab_size: int) -> tuple[int, ...] | None:
    if eos_token_id is None:
        return None
    ids = (eos_token_id,) if isinstance(eos_token_id, int | np.integer) else tuple(eos_token_id)
    if not ids or not all(_is_int(i, 0) and i < vocab_size for i in ids):
        raise ValueError(
            f"{name} must be an id or ids in [0, vocab_size={vocab_size}), got {eos_token_id!r}"
        )
    return tuple(int(i) for i in ids)


def _check_positions(config: ModelConfig, what: str, length: int, new_tokens: int):
    """A position table (learned or sinusoidal) bounds the length; relative positions do not."""
    limit = position_limit(config)
    if limit is not None and length + new_tokens > limit:
        raise ValueError(
            f"{what} length {length} + max_new_tokens {new_tokens} = {length + new_tokens} "
            f"positions, more than the position table's {limit}"
        )


def _inferred_mask(input_ids, pad: int, eos) -> np.ndarray | None:
    """HF's guess without an attention_mask: padding is wherever pad_token_id (if not an EOS) is."""
    if (eos is not None and pad in eos) or not (input_ids == pad).any():
        return None
    return (input_ids != pad).astype(np.int32)


# ---------------------------------------------------------------------------------- inputs
def _model_inputs(plan: Plan, decoder_prompt, input_ids, attention_mask) -> dict:
    """Row-per-beam arrays over the T buffer positions (and the encoder inputs)."""
    beams = plan.num_beams
    rows = lambda x: None if x is None else jnp.asarray(np.repeat(x, beams, axis=0), jnp.int32)
    batch, prompt = decoder_prompt.shape
    new = plan.total_length - prompt
    tokens = np.full((batch, plan.total_length), beam_search.fill_value(plan), np.int64)
    tokens[:, :prompt] = decoder_prompt
    inputs = {"tokens_NT": rows(tokens)}
    family = families.family(plan.config)
    if family.seq2seq:
        inputs["encoder_ids_NS"] = rows(input_ids)
        inputs["encoder_mask_NS"] = rows(attention_mask)
        return inputs
    mask = np.ones_like(decoder_prompt) if attention_mask is None else attention_mask
    positions = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0)
    positions = np.concatenate([positions, positions[:, -1:] + 1 + np.arange(new)], axis=1)
    inputs["positions_NT"] = rows(positions)
    buffer_mask = np.concatenate([mask, np.ones((batch, new), mask.dtype)], axis=1)
    inputs["mask_NT"] = None if attention_mask is None else rows(buffer_mask)
    if family.prefix:
        inputs["prefix_NT"] = rows(buffer_mask * (np.arange(plan.total_length) < prompt))
    return inputs


# ----------------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class Steps:
    """The model as decoding sees it: logits for the position before `cur_len`, and its state.

    `prefill(params, tokens_NT)` reads the prompt; `step(params, state, tokens_NT, cur_len)`
    the token at cur_len - 1; `reorder(state, rows_N)` follows beams to their new rows.
    """

    plan: Plan
    inputs: dict

    def _apply(self, params, tokens, **kwargs):
        model = families.Transformer(self.plan.config)
        x = self.inputs
        if families.family(self.plan.config).seq2seq:
            # Cached steps go through the encoder-decoder's `decode` method.
            method = "decode" if "cache" in kwargs else None
            return model.apply(
                {"params": params},
                kwargs.pop("encoder_ids", x["encoder_ids_NS"]),
                attention_mask=x["encoder_mask_NS"],
                decoder_input_ids=tokens,
                method=method,
                **kwargs,
            )
        positions = kwargs.pop("positions")
        return model.apply(
            {"params": params},
            tokens,
            attention_mask=x["mask_NT"],
            position_ids=positions,
            prefix_mask=x.get("prefix_NT"),
            **kwargs,
        )

    def prefill(self, params, tokens_NT):
        prompt = self.plan.prompt_length
        if not self.plan.use_cache:
            return self.step(params, None, tokens_NT, prompt)
        cache = families.init_cache(
            self.plan.config, batch_size=tokens_NT.shape[0], length=self.plan.total_length
        )
        kwargs = dict(cache=cache, cache_index=0)
        if "positions_NT" in self.inputs:
            kwargs["positions"] = self.inputs["positions_NT"][:, :prompt]
        out = self._apply(params, tokens_NT[:, :prompt], **kwargs)
        return out["lm_logits"][:, -1].astype(jnp.float32), out["cache"]

    def step(self, params, state, tokens_NT, cur_len):
        last = cur_len - 1
        positions = self.inputs.get("positions_NT")
        if not self.plan.use_cache:
            # Filled positions (-1 with beam search) are never attended to; any id will do.
            kwargs = {} if positions is None else dict(positions=positions)
            logits_NTV = self._apply(params, jnp.maximum(tokens_NT, 0), **kwargs)["lm_logits"]
            logits_NV = jax.lax.dynamic_index_in_dim(logits_NTV, last, axis=1, keepdims=False)
            return logits_NV.astype(jnp.float32), None
        kwargs = dict(cache=state, cache_index=last)
        if positions is None:
            kwargs["encoder_ids"] = None
        else:
            kwargs["positions"] = jax.lax.dynamic_slice_in_dim(positions, last, 1, axis=1)
        token_N1 = jax.lax.dynamic_slice_in_dim(tokens_NT, last, 1, axis=1)
        out = self._apply(params, jnp.maximum(token_N1, 0), **kwargs)
        return out["lm_logits"][:, -1].astype(jnp.float32), out["cache"]

    def reorder(self, state, rows_N):
        if state is None:
            return None
        # Cross-attention entries are the same for every beam of an example: left in place.
        return {
            layer: {
                what: jax.tree.map(lambda x: x[rows_N], kv) if what == "attention" else kv
                for what, kv in entry.items()
            }
            for layer, entry in state.items()
        }


# ---------------------------------------------------------------------------- selection
def _choose(plan: Plan, tokens_NT, logits_NV, rng, cur_len):
    scores_NV = process(plan, tokens_NT, cur_len, logits_NV)
    if not plan.do_sample:
        return jnp.argmax(scores_NV, axis=-1).astype(jnp.int32)
    scores_NV = warp(plan, scores_NV, min_keep=1)
    return jax.random.categorical(jax.random.fold_in(rng, cur_len), scores_NV).astype(jnp.int32)


# -------------------------------------------------------------------------------- decode
@functools.partial(jax.jit, static_argnames="plan")
def _decode(plan: Plan, params, inputs, rng):
    """(tokens (B, T), generated lengths (B,)) in one compiled prefill + while_loop."""
    steps = Steps(plan, inputs)
    if plan.num_beams > 1:
        return beam_search.search(plan, steps, params, inputs["tokens_NT"], rng)
    return _greedy_or_sample(plan, steps, params, inputs["tokens_NT"], rng)


def _greedy_or_sample(plan: Plan, steps: Steps, params, tokens_NT, rng):
    eos_E = None if plan.eos is None else jnp.asarray(plan.eos, jnp.int32)

    def emit(tokens_NT, unfinished_N, logits_NV, cur_len):
        # cur_len tokens are known; the chosen one goes to position cur_len.
        new_N = _choose(plan, tokens_NT, logits_NV, rng, cur_len)
        if eos_E is not None:
            new_N = jnp.where(unfinished_N, new_N, plan.pad)
            unfinished_N = unfinished_N & ~jnp.isin(new_N, eos_E)
        tokens_NT = jax.lax.dynamic_update_slice_in_dim(tokens_NT, new_N[:, None], cur_len, axis=1)
        return tokens_NT, unfinished_N

    prompt = plan.prompt_length
    logits_NV, state = steps.prefill(params, tokens_NT)
    unfinished_N = jnp.ones((tokens_NT.shape[0],), bool)
    tokens_NT, unfinished_N = emit(tokens_NT, unfinished_N, logits_NV, prompt)

    def cond(carry):
        cur_len, _, _, unfinished_N = carry
        return (cur_len < plan.total_length) & jnp.any(unfinished_N)

    def body(carry):
        cur_len, tokens_NT, state, unfinished_N = carry
        logits_NV, state = steps.step(params, state, tokens_NT, cur_len)
        tokens_NT, unfinished_N = emit(tokens_NT, unfinished_N, logits_NV, cur_len)
        return cur_len + 1, tokens_NT, state, unfinished_N

    carry = (jnp.asarray(prompt + 1, jnp.int32), tokens_NT, state, unfinished_N)
    cur_len, tokens_NT, _, _ = jax.lax.while_loop(cond, body, carry)
    return tokens_NT, jnp.full((tokens_NT.shape[0],), cur_len - prompt)
