"""HF generation configs: read from a checkpoint and resolved into `decoding.generate`'s options
the way HF's `generate` (transformers 5.x) resolves them.

    stored = read("hf_dir")     # generation_config.json, else config.json's generation fields
    options = resolve(stored, {"num_beams": 2}, config=model_config, prompt_length=1)
    decoding.generate(model_config, params, input_ids=ids, **options)

Precedence is HF's: options given to the call, over the checkpoint's stored config, over HF's
global defaults (`SUPPORTED`). The lengths follow HF's `_prepare_generated_length`, with P the
decoder's input length (the prompt of a decoder, 1 for an encoder-decoder's start token):

  max_new_tokens set       max_length = max_new_tokens + P (it wins over max_length)
  max_length set           the total length, P included
  neither                  20 new tokens: max_length = 20 + P, at most the position table's
                           size (HF's max_position_embeddings)
  min_new_tokens set       min_length = min_new_tokens + P (it wins over min_length)

Options lmsuite does not implement (`UNSUPPORTED`) are refused by name unless they hold a value
at which HF does nothing with them; options that shape HF's return value or speed, never the
tokens (`NO_EFFECT`), are ignored; a key HF does not know either is refused, since a newer HF
option could change the tokens.
"""

import json
import os
from typing import Any

from lmsuite.models import families
from lmsuite.models.config import ModelConfig
from lmsuite.models.inputs import position_limit

# The options lmsuite implements, with HF's global default (None: unset).
SUPPORTED: dict[str, Any] = {
    "max_length": 20,
    "max_new_tokens": None,
    "min_length": 0,
    "min_new_tokens": None,
    "num_beams": 1,
    "do_sample": False,
    "early_stopping": False,
    "length_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "no_repeat_ngram_size": 0,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "decoder_start_token_id": None,
    "use_cache": True,
}
# The options lmsuite does not implement -> the values at which HF does nothing with them.
UNSUPPORTED: dict[str, tuple] = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "exponential_decay_length_penalty": (None,),
    "remove_invalid_values": (None, False),
    "renormalize_logits": (None, False),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "min_p": (None,),
    "top_h": (None,),
    "num_return_sequences": (None, 1),
    "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0.0),
    "constraints": (None,),
    "force_words_ids": (None,),
    "guidance_scale": (None, 1.0),
    "penalty_alpha": (None, 0.0),
    "dola_layers": (None,),
    "max_time": (None,),
    "stop_strings": (None,),
    "token_healing": (None, False),
    "watermarking_config": (None,),
    "low_memory": (None, False),
    "use_mtp": (None, False),
    "prompt_lookup_num_tokens": (None,),
    "assistant_early_exit": (None,),
}
# What HF's return value holds, how fast it gets there, assisted decoding's tuning, metadata.
NO_EFFECT = frozenset(
    {
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "continuous_batching_config",
        "is_assistant",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "assistant_ensemble_weight",
        "speculation_type",
        "max_matching_ngram_size",
        "transformers_version",
        "_from_model_config",
    }
)
KNOWN = frozenset(SUPPORTED) | frozenset(UNSUPPORTED) | NO_EFFECT
ID_OPTIONS = frozenset({"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"})
GENERATION_FILE = "generation_config.json"


def read(directory: str) -> dict[str, Any]:
    """The generation options a HF directory stores (keys set to null left out).

    generation_config.json when there is one; else, as HF falls back for checkpoints saved
    before that file existed, the generation options among config.json's fields (with the old
    `force_bos_token_to_be_generated: true` read as forced_bos_token_id = bos_token_id).
    """
    path = os.path.join(directory, GENERATION_FILE)
    if os.path.isfile(path):
        return {k: v for k, v in _json(path).items() if v is not None}
    fields = _json(os.path.join(directory, "config.json"))
    stored = {k: v for k, v in fields.items() if k in KNOWN and v is not None}
    if fields.get("force_bos_token_to_be_generated") and "forced_bos_token_id" not in stored:
        stored["forced_bos_token_id"] = fields.get("bos_token_id")
    return stored


def source_of(directory: str) -> str:
    """Which file `read(directory)` takes the options from, for messages."""
    path = os.path.join(directory, GENERATION_FILE)
    return path if os.path.isfile(path) else os.path.join(directory, "config.json")


def _json(path: str) -> dict[str, Any]:
    with open(path) as f:
        values = json.load(f)
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds a {type(values).__name__}, not a JSON object")
    return values


def resolve(
    stored: dict[str, Any],
    given: dict[str, Any],
    *,
    config: ModelConfig,
    prompt_length: int,
    fallback_start_id: int | None = None,
    source: str = "the stored generation config",
) -> dict[str, Any]:
    """`decoding.generate`'s keyword options (max_new_tokens included) for one call.

    Args:
      stored: the checkpoint's generation options (`read`, or ids an lmsuite run knows).
      given: the options passed to the call, HF's names; they win, None included.
      config: the model's; its position table bounds the default length, as HF's
        max_position_embeddings does.
      prompt_length: P, the decoder's input length (1 for an encoder-decoder).
      fallback_start_id: an encoder-decoder's start id where neither decoder_start_token_id
        nor bos_token_id is set (HF refuses to generate there).
      source: where `stored` came from, for messages.

    Raises:
      ValueError: an unsupported option at a value that does something (naming it, its value
        and where it was set), an unknown key, or a max_length with no room for a new token.
    """
    _refuse_unknown(stored, given, source)
    merged = dict(SUPPORTED) | {k: v for k, v in stored.items() if v is not None} | dict(given)
    for name, neutral in UNSUPPORTED.items():
        if name in merged and not any(_same(merged[name], v) for v in neutral):
            where = "passed to generate" if name in given else f"set in {source}"
            raise ValueError(
                f"generation option {name}={merged[name]!r} ({where}) is not implemented by "
                f"lmsuite; it is ignored only at {' or '.join(map(repr, neutral))}: pass "
                f"{name}={neutral[-1]!r} to generate to decode without it"
            )
    max_new, min_new = _lengths(merged, stored, given, config, prompt_length)
    sampling = bool(merged["do_sample"])
    options = dict(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        num_beams=_or(merged["num_beams"], 1),
        do_sample=sampling,
        early_stopping=_or(merged["early_stopping"], False),
        length_penalty=_or(merged["length_penalty"], 1.0),
        # HF reads the warpers only when sampling; unused values are not validated either.
        temperature=_or(merged["temperature"], 1.0) if sampling else 1.0,
        top_k=_or(merged["top_k"], 0) if sampling else 0,
        top_p=_or(merged["top_p"], 1.0) if sampling else 1.0,
        no_repeat_ngram_size=_or(merged["no_repeat_ngram_size"], 0),
        forced_bos_token_id=merged["forced_bos_token_id"],
        forced_eos_token_id=merged["forced_eos_token_id"],
        eos_token_id=merged["eos_token_id"],
        pad_token_id=merged["pad_token_id"],
        use_cache=_or(merged["use_cache"], True),
    )
    if families.family(config).seq2seq:
        start = merged["decoder_start_token_id"]
        start = merged["bos_token_id"] if start is None else start
        options["decoder_start_token_id"] = fallback_start_id if start is None else start
    return options


def _refuse_unknown(stored, given, source):
    unknown_given = sorted(k for k in given if k not in KNOWN and k not in stored)
    if unknown_given:
        raise ValueError(
            f"generate got options {unknown_given} that are not HF generation options; lmsuite "
            f"implements {sorted(SUPPORTED)}"
        )
    # A stored key HF does not know may be a newer HF option: refused unless the call drops it.
    unknown = sorted(k for k, v in stored.items() if k not in KNOWN and k not in given)
    if unknown:
        raise ValueError(
            f"{source} sets {', '.join(f'{k}={stored[k]!r}' for k in unknown)}, which lmsuite "
            f"does not know (a newer HF option?); pass {unknown[0]}=None to generate to drop it"
        )


def _same(value, neutral) -> bool:
    # 1 == 1.0 == True in Python: a bool is neutral only where the neutral value is a bool.
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


def _or(value, default):
    return default if value is None else value


def _lengths(merged, stored, given, config: ModelConfig, prompt: int) -> tuple[int, int]:
    """(max_new_tokens, min_new_tokens) as HF's `_prepare_generated_length` sets the lengths."""
    if merged["max_new_tokens"] is not None:
        max_length = merged["max_new_tokens"] + prompt
    elif given.get("max_length") is None and stored.get("max_length") is None:
        max_length = SUPPORTED["max_length"] + prompt
        limit = position_limit(config)
        if limit is not None:
            max_length = min(max_length, limit)
    else:
        max_length = merged["max_length"]
    if max_length <= prompt:
        raise ValueError(
            f"max_length={max_length} leaves no room for a new token after the decoder's "
            f"{prompt} input tokens; raise max_length or set max_new_tokens"
        )
    if merged["min_new_tokens"] is not None:
        min_length = merged["min_new_tokens"] + prompt
    else:
        min_length = _or(merged["min_length"], 0)
    return max_length - prompt, max(0, min_length - prompt)
