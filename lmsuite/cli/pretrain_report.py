"""What `lmsuite train` and `lmsuite pretrain` print after training: the run's summary (steps,
metrics, artefacts) and fill-mask predictions of the finished model on a few held-out sentences,
so the accuracy figure reads as text."""

import re
from pathlib import Path

FILL_MASK_SENTENCES = 3  # held-out sentences `lmsuite pretrain` fills in
FILL_MASK_TOP_K = 3
# A sentence short enough for one line, long enough to give the word some context.
_SENTENCE_WORDS = range(8, 17)
# Candidate words: lowercase (a proper noun is a guess, not a test), between spaces (so the mask
# replaces exactly the word's "▁word" piece, as the MLM preprocessors mask it).
_CANDIDATE = re.compile(r"(?<= )[a-z]{4,}(?= )")
# English function words of four letters or more: not what a fill-mask example should test.
_FUNCTION_WORDS = frozenset(
    "about above after against also although among because been before being below between "
    "both could does doing down during each either every from further have having here however "
    "into itself many more most much must neither only other over same should since some such "
    "than that their them themselves then there these they this those through until upon very "
    "were what when where whether which while whom whose will with within without would".split()
)


def held_out_sentences(corpus, *, limit: int = 200) -> list[str]:
    """The sentences of the first validation documents of a corpus (a name or a corpus
    object), in order (at most `limit`): the held-out text `fill_mask_text` picks from."""
    from lmsuite.data import corpora
    from lmsuite.data import text as text_lib

    corpus = corpora.get_corpus(corpus) if isinstance(corpus, str) else corpus
    dataset = corpus.source().get_dataset("validation", shuffle=False)
    for step in getattr(corpus, "preprocessors", ()):  # TFDS records -> corpus features
        dataset = step(dataset)
    sentences = []
    for example in dataset.take(limit).as_numpy_iterator():
        for paragraph in example["sentences"]:
            sentences += text_lib.split_sentences(paragraph.decode("utf-8"))
            if len(sentences) >= limit:
                return sentences[:limit]
    return sentences


def masked_examples(sentences, *, is_one_piece, n: int, mask_token: str):
    """(masked sentence, true word) for the first `n` sentences of a usable length that have a
    candidate word; the word masked is the sentence's longest lowercase content word (the first
    of equals) that the vocabulary holds as one piece, so one mask stands for the whole word.

    Example: ["It is the capital of a small province in the north of Spain ."] with every
    word one piece -> [("It is the capital of a small [MASK] in the north of Spain .",
    "province")]
    """
    examples = []
    for sentence in sentences:
        if len(sentence.split()) not in _SENTENCE_WORDS:
            continue
        matches = [
            m
            for m in _CANDIDATE.finditer(sentence)
            if m.group() not in _FUNCTION_WORDS and is_one_piece(m.group())
        ]
        if not matches:
            continue
        word = max(matches, key=lambda m: len(m.group()))  # max keeps the first of equals
        masked = sentence[: word.start()] + mask_token + sentence[word.end() :]
        examples.append((masked, word.group()))
        if len(examples) == n:
            break
    return examples


def fill_mask_text(kwargs: dict, model_dir: str) -> list[str]:
    """The finished model's top predictions for one masked word in each of a few held-out
    sentences (none for a model without an MLM head or a task that is not an lmsuite corpus's):
    what the accuracy figure means, on text one can read."""
    from lmsuite.models import families

    config = kwargs["model_config"]
    if families.family(config).scores(config) != "mlm":
        return []
    from lmsuite.data import tasks, text_files

    corpus_name = tasks.PRETRAINING_TASKS.get(kwargs["task"], (None,))[0]
    corpus, what = corpus_name, corpus_name
    if kwargs["task"] in text_files.TEXT_TASKS:  # `--train_files`: the held-out documents
        corpus, what = text_files.corpus_of(text_files.TEXT_TASKS[kwargs["task"]]), "text-file"
    if corpus is None:
        return []
    import lmsuite

    model = lmsuite.load(model_dir)
    vocab = model.vocab
    examples = masked_examples(
        held_out_sentences(corpus),
        is_one_piece=lambda word: len(vocab.encode(word, add_special_tokens=False)) == 1,
        n=FILL_MASK_SENTENCES,
        mask_token=vocab.mask_token,
    )
    if not examples:
        return []
    predictions = model.fill_mask([text for text, _ in examples], top_k=FILL_MASK_TOP_K)
    if len(examples) == 1:  # one text: fill_mask unwraps the list, as HF's pipeline does
        predictions = [predictions]
    lines = [f"fill-mask on held-out {what} sentences (validation split), top {FILL_MASK_TOP_K}:"]
    for (text, word), top in zip(examples, predictions, strict=True):
        guesses = "  ".join(f"{p['token_str'].strip()} {p['score']:.3f}" for p in top)
        lines += [f"  {text}", f"    true: {word}   predicted: {guesses}"]
    return lines


def label_lines(objective, held: dict, held_out) -> list[str]:
    """One line per per-row classification term of `objective` (NSP, SOP, sentence structure): the
    held-out accuracy against always the most frequent held-out label, with the binomial
    probability of doing that well by chance."""
    from lmsuite.training import report

    lines = []
    for metric, label in objective.label_metrics:
        key = f"eval/{metric}"
        if key not in held:
            continue
        majority, rows = report.label_majority(held_out.as_numpy_iterator(), label=label)
        if not rows or not 0.0 < majority < 1.0:
            continue
        unit = "tokens" if dict(objective.label_heads).get(label) else "rows"
        lines.append(
            report.label_line(metric, label, held[key], rows=rows, majority=majority, unit=unit)
        )
    if "eval/rtd_accuracy" in held and "eval/replaced_fraction" in held:
        lines.append(_rtd_line(held, held_out))
    return lines


def _rtd_line(held: dict, held_out) -> str:
    """ELECTRA's replaced-token detection against always answering the larger class (usually
    "real": 1 - the replaced share). The tokens of a row are not independent draws, so the
    binomial p over tokens is optimistic; it still separates "at the prior" from "learnt"."""
    from lmsuite.training import report

    tokens = sum(int(batch["input_mask"].sum()) for batch in held_out.as_numpy_iterator())
    share = held["eval/replaced_fraction"]
    majority = max(share, 1.0 - share)
    right = min(tokens, round(held["eval/rtd_accuracy"] * tokens))
    p_value = report.binomial_upper_tail(right, tokens, majority)
    return (
        f"held-out rtd accuracy: {held['eval/rtd_accuracy']:.4f} over {tokens:,} tokens (always "
        f"the larger class: {majority:.4f}; binomial p = {p_value:.2g})"
    )


def trained_before_stages(run, built) -> dict[int, frozenset[str]]:
    """Stage (1-based, from 2) -> the held-out accuracies trained before it began: the
    objective's prediction (every row of the mixture trains it, as ERNIE 2.0's MLM) and the
    label heads of the tasks the stage before sampled (`mixtures.task_features`)."""
    from lmsuite.data import mixtures

    features = mixtures.task_features(run.data.task, sequence_length=run.data.sequence_length)
    prediction = f"eval/{built.objective.learning_metrics[0]}"
    out = {}
    for i in range(1, len(run.data.stages)):
        labels = {f for task in run.data.stages[i - 1].rates for f in features.get(task, ())}
        heads = {
            f"eval/{metric}" for metric, label in built.objective.label_metrics if label in labels
        }
        out[i + 1] = frozenset({prediction, *heads})
    return out


def _accuracy_name(metric: str) -> str:
    return metric.removeprefix("eval/").removesuffix("_accuracy").replace("_", " ")


def stage_text(model_dir, trained: dict[int, frozenset[str]] | None = None) -> str:
    """A staged run's held-out accuracies across its stages: stages.png beside metrics.jsonl,
    and how far each fell, at its lowest, after each later stage began; with `trained`
    (`trained_before_stages`), only the accuracies trained before it, the others named."""
    from lmsuite.training import metrics, report

    records = metrics.read_jsonl(model_dir / "metrics.jsonl")
    png = model_dir / "stages.png"
    report.plot_stages(records, png)
    lines = [f"  stages:       {png}"]
    # A head whose task had not trained yet sits near chance: its "fall" says nothing.
    every = report.stage_changes(records)
    changes = [c for c in every if trained is None or c.metric in trained.get(c.stage, ())]
    for change in changes:
        lines.append(
            f"held-out {_accuracy_name(change.metric)} accuracy when stage {change.stage} began "
            f"(step {change.step:,}): {change.before:.4f}; lowest after: "
            f"{change.lowest_after:.4f} (fall {change.fall:+.4f})"
        )
    if trained is not None:
        for step, stage in report.stage_starts(records):
            untrained = sorted(
                {c.metric for c in every if c.stage == stage} - set(trained.get(stage, ()))
            )
            if untrained:
                names = ", ".join(_accuracy_name(m) for m in untrained)
                lines.append(
                    f"not compared at stage {stage} (step {step:,}), their tasks had not trained "
                    f"yet: {names}"
                )
    return "\n".join(lines)


def _metric_line(metrics: dict, keys) -> str:
    return "  ".join(f"{k.removeprefix('eval/')} {metrics[k]:.4f}" for k in keys if k in metrics)


def summary_text(run, result) -> str:
    """What a finished `lmsuite train` prints: steps, final and held-out metrics, artefacts."""
    recipe = run.recipe.recipe
    # the objective's own metrics; a mixture's per-task ones ("mlm_accuracy/<task>") are in
    # metrics.jsonl and TensorBoard, too many for a line
    metric_keys = ["loss", *(k for k in run.built().objective.metrics if "/" not in k)]
    train = result.train_metrics
    lines = [
        f"lmsuite train: step {result.step} of {run.trainer.train_steps} on {run.data.task!r} "
        f"with recipe {recipe.name!r}",
        f"  final train:  {_metric_line(train, metric_keys)}"
        + (f"  ({train['tokens_per_sec']:.0f} tokens/s)" if "tokens_per_sec" in train else ""),
    ]
    held_out = result.eval_metrics
    if held_out:
        eval_keys = [f"eval/{k}" for k in metric_keys]
        lines.append(f"  held-out ({run.data.eval_split}):  {_metric_line(held_out, eval_keys)}")
    else:
        lines.append("  held-out: no evaluation ran (train.final_eval = False)")
    model_dir = Path(result.model_dir) if "://" not in result.model_dir else result.model_dir
    steps = ", ".join(map(str, result.checkpoints)) or "none"
    lines += [
        f"  checkpoints:  {model_dir}/checkpoints (steps {steps})",
        f"  metrics:      {model_dir}/metrics.jsonl",
        f"  tensorboard:  tensorboard --logdir {model_dir}/tensorboard",
        f"  config:       {model_dir}/config.gin",
    ]
    return "\n".join(lines)
