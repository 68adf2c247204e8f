"""Beam search (and beam sampling) with the semantics of HF transformers 5.x's `_beam_search`.

Every step keeps, per example, the best K = max(2, 1 + number of EOS ids) * num_beams
continuations of all running beams by accumulated log-probability (or K drawn without
replacement when sampling). Of those, the best num_beams that did not just stop keep running;
those among the first num_beams that stopped (an EOS, or the last buffer position) compete for
the num_beams finished slots with score

    sum of log-probabilities / generated_length ** length_penalty

(generated_length counts the new tokens, the stopping EOS included). The search ends when no
running beam can still beat a finished one (HF's heuristic: the best running score divided by
the current length for early_stopping=False; by the longest possible length for "never" with
a positive length_penalty), when every finished slot is full with early_stopping=True, or when
every continuation has stopped. HF's arithmetic is kept, its -1e9 penalties added in float32
included, since they decide ties between the finished slots. The logits processors
(`logits_processing.process`: n-gram bans, minimum length, forced tokens) and, when sampling, the
warpers run on the log-softmax scores before they join the running scores, as in HF.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.evaluation.logits_processing import process, warp

PENALTY = -1.0e9  # HF's score for "not a candidate"


def fill_value(plan) -> int:
    """What HF's beam search leaves after a row's end: pad_token_id unless that is None or 0
    (HF tests the pad tensor's truth), else the first EOS id; -1 without EOS ids.

    Greedy and sampled rows all end together (finished ones padded with pad_token_id), so
    their buffer's fill is never returned.
    """
    if plan.num_beams == 1:
        return 0
    if plan.eos is None:
        return -1
    return plan.pad if plan.pad else plan.eos[0]


def _length_table(plan) -> jnp.ndarray:
    """length ** length_penalty for every generated length, rounded once to float32 as HF's
    Python-float divisor is."""
    lengths = np.arange(plan.total_length - plan.prompt_length + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return jnp.asarray((lengths**plan.length_penalty).astype(np.float32))


def _gather(x_BK, index_BJ):
    """x[b, index[b, j]] over the beam axis, for any trailing dims."""
    index = index_BJ.reshape(index_BJ.shape + (1,) * (x_BK.ndim - 2))
    return jnp.take_along_axis(x_BK, index, axis=1)


def search(plan, steps, params, tokens_NT, rng):
    """(best row per example (B, T), its generated length (B,)): one prefill + while_loop."""
    beams, total, prompt = plan.num_beams, plan.total_length, plan.prompt_length
    batch = tokens_NT.shape[0] // beams
    num_eos = 0 if plan.eos is None else len(plan.eos)
    keep = max(2, 1 + num_eos) * beams
    eos_E = None if plan.eos is None else jnp.asarray(plan.eos, jnp.int32)
    divisor_G = _length_table(plan)
    stop_when_full = plan.early_stopping is True

    def advance(carry, logits_NV, state):
        cur_len = carry["cur_len"]
        vocab = logits_NV.shape[-1]
        log_probs_NV = jax.nn.log_softmax(logits_NV, axis=-1)
        # HF runs the processors on log-probabilities here: a forced token scores 0.
        running_NT = carry["running"].reshape(batch * beams, total)
        log_probs_NV = process(plan, running_NT, cur_len, log_probs_NV)
        if plan.do_sample:
            log_probs_NV = warp(plan, log_probs_NV, min_keep=max(2, 1 + num_eos))
        log_probs_BW = (
            log_probs_NV.reshape(batch, beams, vocab) + carry["running_scores"][:, :, None]
        ).reshape(batch, beams * vocab)

        # Top-K continuations: best K, or K drawn without replacement (Gumbel top-K), sorted.
        if plan.do_sample:
            noise_BW = jax.random.gumbel(jax.random.fold_in(rng, cur_len), log_probs_BW.shape)
            index_BK = jax.lax.top_k(log_probs_BW + noise_BW, keep)[1]
            drawn_BK = jnp.take_along_axis(log_probs_BW, index_BK, axis=1)
            order_BK = jnp.argsort(-drawn_BK, axis=1, stable=True)
            index_BK = jnp.take_along_axis(index_BK, order_BK, axis=1)
            top_BK = jnp.take_along_axis(drawn_BK, order_BK, axis=1)
        else:
            top_BK, index_BK = jax.lax.top_k(log_probs_BW, keep)
        source_BK = index_BK // vocab
        token_BK = (index_BK % vocab).astype(jnp.int32)
        candidates_BKT = _gather(carry["running"], source_BK)
        candidates_BKT = jax.lax.dynamic_update_slice_in_dim(
            candidates_BKT, token_BK[:, :, None], cur_len, axis=2
        )
        stops_BK = cur_len + 1 >= total
        if eos_E is not None:
            stops_BK = stops_BK | jnp.isin(token_BK, eos_E)
        stops_BK = jnp.broadcast_to(stops_BK, token_BK.shape)

        # The best num_beams that did not stop keep running.
        running_scores_BK = top_BK + stops_BK.astype(jnp.float32) * PENALTY
        next_BJ = jax.lax.top_k(running_scores_BK, beams)[1]
        running = _gather(candidates_BKT, next_BJ)
        running_scores = _gather(running_scores_BK, next_BJ)
        rows_N = (jnp.arange(batch)[:, None] * beams + _gather(source_BK, next_BJ)).reshape(-1)

        # Those of the first num_beams that stopped compete for the finished slots.
        finished_now_BK = stops_BK & (jnp.arange(keep) < beams)[None, :]
        scores_BK = top_BK / divisor_G[cur_len + 1 - prompt]
        full_B1 = jnp.all(carry["finished"], axis=1, keepdims=True) & stop_when_full
        scores_BK = scores_BK + full_B1.astype(jnp.float32) * PENALTY
        scores_BK = scores_BK + (~carry["improvable"]).astype(jnp.float32) * PENALTY
        scores_BK = scores_BK + (~finished_now_BK).astype(jnp.float32) * PENALTY
        lengths_BK = jnp.broadcast_to(cur_len + 1 - prompt, token_BK.shape)
        merged = dict(
            done=jnp.concatenate([carry["done"], candidates_BKT], axis=1),
            scores=jnp.concatenate([carry["scores"], scores_BK], axis=1),
            finished=jnp.concatenate([carry["finished"], finished_now_BK], axis=1),
            lengths=jnp.concatenate([carry["lengths"], lengths_BK], axis=1),
        )
        best_BJ = jax.lax.top_k(merged["scores"], beams)[1]
        out = {name: _gather(x, best_BJ) for name, x in merged.items()}

        # Can a running beam still beat the worst finished one?
        cur_len = cur_len + 1
        if plan.early_stopping == "never" and plan.length_penalty > 0:
            best_length = total - prompt
        else:
            best_length = cur_len - prompt
        best_running_B1 = running_scores[:, :1] / divisor_G[best_length]
        worst_finished_BJ = jnp.where(
            out["finished"], jnp.min(out["scores"], axis=1, keepdims=True), PENALTY
        )
        improvable = carry["improvable"] & jnp.any(
            best_running_B1 > worst_finished_BJ, axis=1, keepdims=True
        )
        go_on = (
            jnp.any(improvable) & ~(jnp.all(out["finished"]) & stop_when_full) & ~jnp.all(stops_BK)
        )
        carry = dict(
            out,
            cur_len=cur_len,
            running=running,
            running_scores=running_scores,
            improvable=improvable,
            go_on=go_on,
        )
        return carry, steps.reorder(state, rows_N)

    running = tokens_NT.reshape(batch, beams, total)
    first_only = jnp.where(jnp.arange(beams) == 0, 0.0, PENALTY).astype(jnp.float32)
    carry = dict(
        cur_len=jnp.asarray(prompt, jnp.int32),
        running=running,
        running_scores=jnp.broadcast_to(first_only, (batch, beams)),
        done=running,
        scores=jnp.full((batch, beams), PENALTY, jnp.float32),
        finished=jnp.zeros((batch, beams), bool),
        lengths=jnp.zeros((batch, beams), jnp.int32),
        improvable=jnp.ones((batch, 1), bool),
        go_on=jnp.asarray(True),
    )

    def forward(carry, state):
        flat_NT = carry["running"].reshape(batch * beams, total)
        return steps.step(params, state, flat_NT, carry["cur_len"])

    def body(loop):
        # The next logits only while the search goes on: no forward after the last step, and
        # `advance` is traced once (the prefill's logits enter the loop like any step's).
        carry, logits_NV, state = loop
        carry, state = advance(carry, logits_NV, state)
        logits_NV, state = jax.lax.cond(
            carry["go_on"], forward, lambda c, s: (logits_NV, s), carry, state
        )
        return carry, logits_NV, state

    logits_NV, state = steps.prefill(params, tokens_NT)
    loop = jax.lax.while_loop(lambda loop: loop[0]["go_on"], body, (carry, logits_NV, state))
    return loop[0]["done"][:, 0], loop[0]["lengths"][:, 0]
