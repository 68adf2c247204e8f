"""The score rules between the model's logits and the choice of a token, in HF's order.

`process` applies the logits processors lmsuite implements, in the order HF's
`_get_logits_processor` builds them (transformers 5.x):

  no_repeat_ngram_size   a token that would complete an n-gram already in the sequence: -inf
  min_new_tokens         the EOS ids: -inf while fewer new tokens than this are generated
  forced_bos             with one token known (the decoder start): only this id (0), rest -inf
  forced_eos             at the last position the buffer allows: only these ids (0), rest -inf

`warp` applies the sampling warpers after them (temperature, top-k, top-p). Greedy search and
sampling process the raw logits; beam search processes log-softmax scores, as HF does, so a
forced token has log-probability 0 and the others -inf.

Both read the sequence so far from a fixed-length buffer `tokens_NT` of which the first
`cur_len` positions are known (prompt or decoder start included, as HF's `input_ids`); the
rest holds fill values that no rule may read.
"""

import jax
import jax.numpy as jnp


def process(plan, tokens_NT, cur_len, scores_NV):
    """HF's logits processors that `plan` turns on, in HF's order (see the module docstring).

    Example (no_repeat_ngram_size=2, tokens so far [5, 7, 5]): 7 followed 5 once, so the
    score of 7 becomes -inf; every other score is unchanged.
    """
    if plan.no_repeat_ngram_size:
        scores_NV = _ban_repeated_ngrams(plan.no_repeat_ngram_size, tokens_NT, cur_len, scores_NV)
    if plan.min_new_tokens and plan.eos is not None:
        too_early = cur_len - plan.prompt_length < plan.min_new_tokens
        scores_NV = jnp.where(too_early & _is_one_of(plan.eos, scores_NV), -jnp.inf, scores_NV)
    if plan.forced_bos is not None:
        scores_NV = _force(scores_NV, (plan.forced_bos,), cur_len == 1)
    if plan.forced_eos is not None:
        scores_NV = _force(scores_NV, plan.forced_eos, cur_len == plan.total_length - 1)
    return scores_NV


def warp(plan, scores_NV, *, min_keep: int):
    """HF's sampling warpers in its order: temperature, top-k, top-p (removed: -inf)."""
    if plan.temperature != 1.0:
        scores_NV = scores_NV / plan.temperature
    vocab = scores_NV.shape[-1]
    if plan.top_k:
        k = min(max(plan.top_k, min_keep), vocab)
        kth_N1 = jax.lax.top_k(scores_NV, k)[0][:, -1:]
        scores_NV = jnp.where(scores_NV < kth_N1, -jnp.inf, scores_NV)
    if plan.top_p < 1.0:
        order_NV = jnp.argsort(scores_NV, axis=-1)  # ascending, as HF sorts
        sorted_NV = jnp.take_along_axis(scores_NV, order_NV, axis=-1)
        cumulative_NV = jnp.cumsum(jax.nn.softmax(sorted_NV, axis=-1), axis=-1)
        keep_last = (jnp.arange(vocab) >= vocab - min_keep)[None, :]
        remove_NV = (cumulative_NV <= 1 - plan.top_p) & ~keep_last
        rows_N1 = jnp.arange(remove_NV.shape[0])[:, None]
        remove_NV = jnp.zeros_like(remove_NV).at[rows_N1, order_NV].set(remove_NV)
        scores_NV = jnp.where(remove_NV, -jnp.inf, scores_NV)
    return scores_NV


def _is_one_of(ids: tuple[int, ...], scores_NV):
    """Bool (1, V): True at the columns of `ids`."""
    return jnp.isin(jnp.arange(scores_NV.shape[-1]), jnp.asarray(ids))[None, :]


def _force(scores_NV, ids: tuple[int, ...], now):
    """When `now`: 0 at `ids`, -inf elsewhere (HF's forced BOS / EOS)."""
    forced_NV = jnp.where(_is_one_of(ids, scores_NV), 0.0, -jnp.inf).astype(scores_NV.dtype)
    return jnp.where(now, jnp.broadcast_to(forced_NV, scores_NV.shape), scores_NV)


def _ban_repeated_ngrams(n: int, tokens_NT, cur_len, scores_NV):
    """-inf for each token that, appended, would repeat an n-gram of the known tokens.

    The n-grams are the windows tokens[s : s + n] that lie inside the first cur_len positions;
    one whose first n - 1 tokens equal the last n - 1 known tokens bans its last token. With
    fewer than n known tokens nothing is banned. Example (n=3, known [4, 9, 4, 9]): the
    window [4, 9, 4] starts with the suffix [4, 9], so 4 is banned.
    """
    width = tokens_NT.shape[1]
    if width < n:
        return scores_NV
    vocab = scores_NV.shape[-1]
    starts = width - n + 1
    windows_NSn = jnp.stack([tokens_NT[:, j : j + starts] for j in range(n)], axis=-1)
    suffix_Nn = jax.lax.dynamic_slice_in_dim(tokens_NT, jnp.maximum(cur_len + 1 - n, 0), n - 1, 1)
    inside_1S = (jnp.arange(starts) <= cur_len - n)[None, :]  # the window ends before cur_len
    matches_NS = jnp.all(windows_NSn[..., :-1] == suffix_Nn[:, None, :], axis=-1) & inside_1S
    # Non-matching windows write to a spare column V, so they cannot unban another's token.
    banned_NS = jnp.where(matches_NS, jnp.clip(windows_NSn[..., -1], 0, vocab), vocab)
    rows_N1 = jnp.arange(tokens_NT.shape[0])[:, None]
    banned_NV = jnp.zeros((tokens_NT.shape[0], vocab + 1), bool).at[rows_N1, banned_NS].set(True)
    return jnp.where(banned_NV[:, :vocab], -jnp.inf, scores_NV)
