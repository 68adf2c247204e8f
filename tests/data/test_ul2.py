"""UL2's denoisers against closed form: mode tokens first, sentinels paired between inputs and
targets, each full chunk's noise count and span count exactly T5's, the random span lengths at
their exact mean within the sample's error, and the mixture's shares at its rates."""

import math

import numpy as np
import pytest
import seqio

from lmsuite.data import mixtures, tasks
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import span_corruption, ul2

SPANS = [d for d in ul2.DENOISERS if not d.is_prefix_lm]
STATS_LENGTH = 256  # long enough that mu=64 at 50% noise makes several spans
EXAMPLES = 300


@pytest.fixture(scope="module")
def ul2_tasks(tiny_vocab):
    """Every denoiser's task on wiki_sample with the tiny vocabulary, and their mixture."""
    names = {}
    for d in ul2.DENOISERS:
        task = tasks.build_task("wiki_sample", d.name, vocab=tiny_vocab, name=f"test_{d.name}")
        names[d.name] = task.name
    seqio.MixtureRegistry.remove("test_ul2")
    seqio.MixtureRegistry.add("test_ul2", [(names[d.name], d.rate) for d in ul2.DENOISERS])
    yield names
    seqio.MixtureRegistry.remove("test_ul2")
    for name in names.values():
        seqio.TaskRegistry.remove(name)


def _parse(example, *, mode_ids, sentinels, eos):
    """(sentinel count S, noise span lengths, raw chunk length) of one span-denoiser example,
    asserting the mode tokens, the EOS and the sentinel pairing on the way."""
    inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
    assert inputs[: len(mode_ids)] == mode_ids
    assert inputs[-1] == eos and targets[-1] == eos
    body, targets = inputs[len(mode_ids) : -1], targets[:-1]
    index = {s: i for i, s in enumerate(sentinels)}
    in_sentinels = [index[t] for t in body if t in index]
    out_sentinels = [index[t] for t in targets if t in index]
    count = len(in_sentinels)
    assert in_sentinels == out_sentinels == list(range(count)) and count >= 1
    assert body[-1] == sentinels[count - 1] and targets[0] == sentinels[0]  # ends with noise
    starts = [i for i, t in enumerate(targets) if t in index] + [len(targets)]
    spans = [b - a - 1 for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert min(spans) >= 1
    return count, spans, len(body) - count + sum(spans)


def _composition_part(total: int, parts: int) -> tuple[float, float]:
    """Mean and standard deviation of one part of a uniformly random composition of `total`
    into `parts` positive parts: P(k) = C(total - k - 1, parts - 2) / C(total - 1, parts - 1)."""
    if parts == 1:
        return float(total), 0.0
    ks = np.arange(1, total - parts + 2)
    p = np.array([math.comb(total - k - 1, parts - 2) for k in ks], float)
    p /= math.comb(total - 1, parts - 1)
    mean = float((ks * p).sum())
    return mean, float(math.sqrt(((ks - mean) ** 2 * p).sum()))


def test_lengths_fit_every_denoiser_and_name_the_one_that_does_not():
    # X-denoisers at 50% noise make targets as long as the inputs; R at 512 makes 114.
    assert ul2.lengths(512) == {"inputs": 512, "targets": 512}
    assert ul2.lengths(128) == {"inputs": 128, "targets": 128}
    assert ul2.targets_length(ul2.BY_NAME["ul2_r_mu3_r15"], 512) == 114
    assert ul2.targets_length_problem(ul2.lengths(64)) is None
    problem = ul2.targets_length_problem({"inputs": 512, "targets": 114})
    assert "ul2_x_mu3_r50" in problem and "'targets': 512" in problem
    assert [d.rate for d in ul2.DENOISERS] == pytest.approx([0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.2])
    assert sum(d.rate for d in ul2.DENOISERS if d.paradigm == "S") == pytest.approx(0.2)


@pytest.mark.parametrize("denoiser", SPANS, ids=lambda d: d.name)
def test_span_denoiser_statistics_are_t5s_closed_form(denoiser, ul2_tasks, tiny_vocab):
    mode_ids = [int(i) for i in tiny_vocab.encode(denoiser.mode)]
    ids = vocab_lib.special_ids(tiny_vocab)
    task = seqio.get_mixture_or_task(ul2_tasks[denoiser.name])
    lengths = ul2.lengths(STATS_LENGTH)
    dataset = task.get_dataset(lengths, split="train", shuffle=False, seed=1)
    raw, _ = span_corruption.random_spans_helper(
        inputs_length=STATS_LENGTH - len(mode_ids),
        noise_density=denoiser.density,
        mean_noise_span_length=denoiser.mean_span,
    )
    noise = int(round(raw * denoiser.density))
    count = max(1, int(round(noise / denoiser.mean_span)))
    first_spans = []
    for example in dataset.take(EXAMPLES).as_numpy_iterator():
        assert len(example["inputs"]) == STATS_LENGTH  # mode + corrupted + EOS fill the inputs
        assert len(example["targets"]) <= lengths["targets"]
        spans_seen, spans, length = _parse(
            example, mode_ids=mode_ids, sentinels=list(ids.sentinels), eos=ids.eos
        )
        assert (length, sum(spans), spans_seen) == (raw, noise, count)
        first_spans.append(spans[0])
    # Density and mean span are fixed by the chunk length: r and mu up to T5's rounding.
    assert abs(noise / raw - denoiser.density) <= 0.5 / raw
    assert abs(noise / count - denoiser.mean_span) <= 0.5 * denoiser.mean_span / count + 1e-9
    # The spans are a uniform composition: the first one's sample mean within 4 standard errors.
    mean, sd = _composition_part(noise, count)
    assert abs(np.mean(first_spans) - mean) <= 4 * sd / math.sqrt(len(first_spans)) + 1e-9
    if count > 1:
        assert len(set(first_spans)) > 1


def test_s_denoiser_is_a_prefix_lm_behind_its_mode(ul2_tasks, tiny_vocab):
    d = ul2.BY_NAME["ul2_s"]
    mode_ids = [int(i) for i in tiny_vocab.encode(d.mode)]
    ids = vocab_lib.special_ids(tiny_vocab)
    task = seqio.get_mixture_or_task(ul2_tasks[d.name])
    lengths = ul2.lengths(64)
    prefixes = []
    for example in task.get_dataset(lengths, split="train", shuffle=False).take(200):
        inputs, targets = example["inputs"].numpy().tolist(), example["targets"].numpy().tolist()
        assert inputs[: len(mode_ids)] == mode_ids and len(inputs) <= 64
        assert inputs[-1] == targets[-1] == ids.eos and len(targets) <= lengths["targets"]
        assert not set(inputs + targets) & set(ids.sentinels)
        prefixes.append(len(inputs) - len(mode_ids) - 1)
    assert min(prefixes) >= 1 and len(set(prefixes)) > 10  # a random split point


def test_mixture_shares_are_the_rates_and_every_input_starts_with_its_mode(ul2_tasks, tiny_vocab):
    modes = {m: tuple(tiny_vocab.encode(m)) for m in (ul2.R_MODE, ul2.X_MODE, ul2.S_MODE)}
    assert len(set(modes.values())) == 3
    names = mixtures.task_names("test_ul2")
    rates = mixtures.rates("test_ul2")
    by_task = {ul2_tasks[d.name]: d for d in ul2.DENOISERS}
    assert {t: rates[t] for t in names} == pytest.approx({t: by_task[t].rate for t in names})
    n = 2000
    # Unshuffled tasks (no shuffle buffers to fill); the sampling between them is seeded.
    dataset = mixtures.mixed_examples(
        "test_ul2",
        sequence_length=ul2.lengths(64),
        split="train",
        shuffle=False,
        seed=5,
        example_task=True,
    )
    drawn = []
    for example in dataset.take(n).as_numpy_iterator():
        task = names[example["task_index"]]
        mode = modes[by_task[task].mode]
        assert tuple(example["inputs"][: len(mode)].tolist()) == mode, task
        drawn.append(int(example["task_index"]))
    counts = np.bincount(drawn, minlength=len(names))
    for task, count in zip(names, counts, strict=True):
        p = rates[task]
        z = (count - n * p) / math.sqrt(n * p * (1 - p))
        assert abs(z) < 4, (task, count, n * p, z)


def test_registered_mixtures_hold_every_denoiser_at_its_rate():
    for corpus in ("wiki_sample", "shakespeare", "peoples_daily", "wikipedia", "c4"):
        shares = mixtures.rates(f"{corpus}_ul2")
        assert shares == pytest.approx({f"{corpus}_{d.name}": d.rate for d in ul2.DENOISERS})
