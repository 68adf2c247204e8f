"""`lmsuite eval`: its files, its figures against the run's own held-out evaluation and against
HF torch on the same examples, seq2seq sequence accuracy on a hand-made case, bad inputs.

The MLM run is a tiny BERT trained for two steps through the CLI (final evaluation over two
batches); the seq2seq Evaluator path trains a tiny T5 (slow).
"""

import glob
import json
import math
import os
import shutil

import numpy as np
import pytest
import seqio
import tensorflow as tf
import torch
import transformers

import lmsuite
from lmsuite import cli
from lmsuite.evaluation import evaluate, seqio_scores
from lmsuite.models import ModelConfig
from lmsuite.training import input_pipeline, metrics, recipes
from tests.training.test_recipes import train_argv

BATCH, EVAL_BATCHES = 8, 2


@pytest.fixture(scope="module")
def mlm_training(tmp_path_factory):
    """(the run's directory, the splits its held-out pipelines were built from). The run
    evaluates after each of its two steps: the second evaluation reads the batches the first
    kept, and `lmsuite eval` builds them afresh."""
    model_dir = tmp_path_factory.mktemp("eval") / "bert"
    argv = train_argv(
        recipes.RECIPES["bert_mlm"],
        "bert_tiny",
        model_dir,
        f"--gin.train.eval_batches={EVAL_BATCHES}",
        "--gin.train.eval_every=1",
        "--gin.LEARNING_RATE=3e-3",
    )
    built, eval_dataset = [], input_pipeline.eval_dataset

    def counted(**kwargs):
        built.append(kwargs["split"])
        return eval_dataset(**kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(input_pipeline, "eval_dataset", counted)
        assert cli.main(argv) == 0
    return str(model_dir), built


@pytest.fixture(scope="module")
def mlm_run(mlm_training):
    return mlm_training[0]


@pytest.fixture(scope="module")
def mlm_eval(mlm_run):
    argv = ["eval", f"--model_dir={mlm_run}", f"--batch_size={BATCH}"]
    assert cli.main([*argv, f"--max_batches={EVAL_BATCHES}"]) == 0
    path = f"{mlm_run}/eval/wiki_sample_bert_mlm_validation_step2.json"
    with open(path) as f:
        return json.load(f)


def _event_scalars(directory: str) -> dict[str, tuple[int, float]]:
    """tag -> (step, value) of the TensorBoard event files under `directory`."""
    found = {}
    for path in glob.glob(f"{directory}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)))
    return found


def test_eval_writes_the_json_and_tensorboard_scalars_at_the_checkpoint_step(mlm_run, mlm_eval):
    assert mlm_eval["step"] == 2 and mlm_eval["split"] == "validation"
    assert mlm_eval["num_examples"] == BATCH * EVAL_BATCHES
    assert mlm_eval["path"] == "eval_step"  # MLM's gathered predictions: not the Evaluator's
    scalars = _event_scalars(f"{mlm_run}/eval/wiki_sample_bert_mlm")
    for key in ("loss", "token_accuracy", "perplexity"):
        assert scalars[key] == (2, pytest.approx(mlm_eval["metrics"][key], rel=1e-6))
    found = mlm_eval["metrics"]
    assert found["perplexity"] == pytest.approx(math.exp(found["loss"]), rel=1e-9)


def test_eval_equals_the_runs_own_held_out_figures(mlm_training, mlm_eval):
    mlm_run, built = mlm_training
    held_out = [r for r in metrics.read_jsonl(f"{mlm_run}/metrics.jsonl") if "eval/loss" in r]
    assert [r["step"] for r in held_out] == [1, 2]
    assert built == ["validation"]  # once: step 2's evaluation read the batches step 1's kept
    for key in ("eval/loss", "eval/mlm_loss", "eval/mlm_accuracy"):
        assert mlm_eval["metrics"][key] == pytest.approx(held_out[-1][key], rel=1e-6), key


def test_eval_equals_hf_torch_on_the_same_examples(mlm_run, mlm_eval, tmp_path):
    """Token-weighted cross-entropy and accuracy of the masked positions, recomputed with
    transformers' BertForMaskedLM on the exported weights."""
    model = lmsuite.load(mlm_run)
    model.save_hf(str(tmp_path / "hf"))
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    recipe = recipes.RECIPES["bert_mlm"]
    data = input_pipeline.eval_dataset(
        task="wiki_sample_bert_mlm",
        sequence_length=recipe.lengths_for(64),
        feature_converter=recipe.converter(pack=False),
        global_batch_size=BATCH,
        batches=EVAL_BATCHES,
    )
    nll = correct = tokens = 0.0
    for batch in data.as_numpy_iterator():
        with torch.no_grad():
            logits = hf(
                input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
                token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
            ).logits.double()
        positions = torch.tensor(batch["masked_positions"], dtype=torch.long)
        gathered = torch.take_along_dim(logits, positions[..., None], dim=1)
        logp = torch.log_softmax(gathered, dim=-1)
        targets = torch.tensor(batch["masked_ids"], dtype=torch.long)
        used = torch.tensor(batch["masked_weights"]) > 0
        nll -= torch.take_along_dim(logp, targets[..., None], dim=-1)[..., 0][used].sum().item()
        correct += (gathered.argmax(-1) == targets)[used].sum().item()
        tokens += used.sum().item()
    found = mlm_eval["metrics"]
    assert found["loss"] == pytest.approx(nll / tokens, rel=1e-4)
    assert found["token_accuracy"] == pytest.approx(correct / tokens, abs=1e-9)


def test_sequence_accuracy_on_a_hand_made_case():
    # two sequences of three target slots; the third slot of the second is padding
    logits = np.full((2, 3, 4), -2.0, np.float32)
    targets = np.array([[1, 2, 3], [1, 1, 0]], np.int32)
    weights = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    logits[0, [0, 1, 2], [1, 2, 3]] = 2.0  # all right
    logits[1, 0, 1] = 2.0  # right
    logits[1, 1, 3] = 2.0  # wrong: predicts 3, target 1
    logits[1, 2, 2] = 9.0  # padding, wrong: ignored
    stats = np.asarray(seqio_scores.example_stats(logits, targets, weights))
    found = seqio_scores.summarize(stats, sequences=True)
    log_z = np.log(np.exp(2.0) + 3 * np.exp(-2.0))
    right, wrong = log_z - 2.0, log_z + 2.0
    expected_loss = (4 * right + wrong) / 5  # five target tokens, four predicted right
    assert found["sequence_accuracy"] == 0.5
    assert found["token_accuracy"] == pytest.approx(4 / 5)
    assert found["loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert found["perplexity"] == pytest.approx(math.exp(expected_loss), rel=1e-6)


def _eval_error(capsys, *argv) -> str:
    code = cli.main(["eval", *argv])
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err
    return err


def test_bad_inputs_are_named_with_exit_code_2(mlm_run, capsys, tmp_path):
    err = _eval_error(capsys, f"--model_dir={mlm_run}", "--step=7")
    assert "no committed checkpoint step 7; committed: [2]" in err
    err = _eval_error(capsys, f"--model_dir={mlm_run}", "--task=wiki_sample_bert_mlmm")
    assert "unknown task 'wiki_sample_bert_mlmm'; did you mean 'wiki_sample_bert_mlm'?" in err
    err = _eval_error(capsys, f"--model_dir={mlm_run}", "--split=validaton")
    assert "has no split 'validaton'" in err and "'validation'" in err
    empty = tmp_path / "no_checkpoint"
    empty.mkdir()
    shutil.copy(f"{mlm_run}/run.json", empty / "run.json")
    err = _eval_error(capsys, f"--model_dir={empty}")
    assert "has no committed checkpoint" in err and "run.json" in err
    assert not os.path.exists(empty / "eval")


WEIGHTS = {"wiki_sample_ernie2_sentence_distance": 3.0}
LABEL_WEIGHTS = {"sentence_distance_label": 0.25}


@pytest.fixture(scope="module")
def ernie2_run(tmp_path_factory):
    """ERNIE 2.0's multi-task row on its four-task mixture, two steps, with task weights and
    loss options of its own (its evaluation must score that loss, not the row's default)."""
    model_dir = tmp_path_factory.mktemp("eval") / "ernie2"
    argv = train_argv(
        recipes.RECIPES["ernie2"],
        "ernie2_tiny",
        model_dir,
        "--gin.TASK='wiki_sample_ernie2_mixture'",
        f"--gin.train.eval_batches={EVAL_BATCHES}",
        f"--gin.make_recipe.task_weights={WEIGHTS}",
        f"--gin.make_recipe.loss_options={{'label_weights': {LABEL_WEIGHTS}}}",
    )
    assert cli.main(argv) == 0
    return str(model_dir)


def test_eval_of_a_mixture_run_equals_its_own_held_out_figures(ernie2_run, capsys):
    """The run's mixture by default (a mixture was once an 'unknown task'), per-task metrics,
    and the run's own task weights and loss options (the row's defaults were once used, and
    the total loss differed from the run's)."""
    assert cli.main(["eval", f"--model_dir={ernie2_run}", f"--batch_size={BATCH}",
                     f"--max_batches={EVAL_BATCHES}"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "wiki_sample_ernie2_mixture validation at step 2" in out
    assert f"the run's loss options: {{'label_weights': {LABEL_WEIGHTS}}}" in out
    assert f"task weights: {WEIGHTS}" in out and "note:" not in out
    with open(f"{ernie2_run}/eval/wiki_sample_ernie2_mixture_validation_step2.json") as f:
        record = json.load(f)
    found = record["metrics"]
    assert record["recipe_options"]["task_weights"] == WEIGHTS and record["notes"] == []
    held_out = [r for r in metrics.read_jsonl(f"{ernie2_run}/metrics.jsonl") if "eval/loss" in r]
    keys = ["eval/loss", "eval/mlm_loss", "eval/mlm_accuracy/wiki_sample_ernie2_token_document"]
    for key in keys:
        assert found[key] == pytest.approx(held_out[-1][key], rel=1e-6), key


def test_eval_of_a_run_json_without_recipe_options_says_it_uses_the_rows_defaults(
    ernie2_run, capsys, tmp_path
):
    """A run.json written before the record: the row's defaults, said as a note; the weighed
    losses then differ from the run's own (which is why the record is there), the accuracies,
    which no weight touches, do not."""
    old_run = tmp_path / "old"
    shutil.copytree(ernie2_run, old_run, ignore=shutil.ignore_patterns("eval"))
    with open(old_run / "run.json") as f:
        record = json.load(f)
    del record["recipe_options"]
    (old_run / "run.json").write_text(json.dumps(record))
    assert cli.main(["eval", f"--model_dir={old_run}", f"--batch_size={BATCH}",
                     f"--max_batches={EVAL_BATCHES}"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "note: the run's run.json predates its recipe options" in out
    with open(old_run / "eval/wiki_sample_ernie2_mixture_validation_step2.json") as f:
        found = json.load(f)
    assert found["recipe_options"]["task_weights"] == {} and len(found["notes"]) == 1
    held_out = [r for r in metrics.read_jsonl(f"{ernie2_run}/metrics.jsonl") if "eval/loss" in r]
    for key in ("eval/mlm_accuracy", "eval/sentence_distance_label_accuracy"):
        assert found["metrics"][key] == pytest.approx(held_out[-1][key], rel=1e-6), key
    assert abs(found["metrics"]["eval/loss"] - held_out[-1]["eval/loss"]) > 1e-3


def test_eval_of_one_task_of_a_multi_task_run_scores_its_own_head(ernie2_run, capsys):
    """One task of the mixture: its examples get the other heads' labels as -1 (they once raised
    a KeyError); only its own head is reported, its accuracy and majority equal a direct count
    over the same batches, and the binomial line is printed."""
    from lmsuite.evaluation.load import load_run
    from lmsuite.models import Transformer

    task, label = "wiki_sample_ernie2_sentence_distance", "sentence_distance_label"
    argv = ["eval", f"--model_dir={ernie2_run}", f"--task={task}", f"--batch_size={BATCH}"]
    assert cli.main([*argv, "--max_batches=3"]) == 0
    out = capsys.readouterr().out
    with open(f"{ernie2_run}/eval/{task}_validation_step2.json") as f:
        record = json.load(f)
    heads = {k for k in record["metrics"] if k.startswith("eval/") and k.endswith("_accuracy")}
    heads -= {"eval/mlm_accuracy"}
    assert heads == {f"eval/{label}_accuracy"}
    assert list(record["labels"]) == [label]

    loaded = load_run(ernie2_run, None)
    built = recipes.build(recipes.make_recipe(name="ernie2"), model_config=loaded.config)
    data = input_pipeline.eval_dataset(
        task=task,
        sequence_length=recipes.RECIPES["ernie2"].lengths_for(64),
        feature_converter=built.feature_converter,
        global_batch_size=BATCH,
        batches=3,
        label_fill=dict(built.objective.label_heads),
    )
    right, labels = 0, []
    for batch in data.as_numpy_iterator():
        outputs = Transformer(loaded.config).apply(
            {"params": loaded.params}, **built.objective.model_inputs(batch), deterministic=True
        )
        right += int((np.asarray(outputs[f"{label}_logits"]).argmax(-1) == batch[label]).sum())
        labels += batch[label].tolist()
    assert len(labels) == 3 * BATCH and min(labels) >= 0
    counted = record["labels"][label]
    assert counted["labelled"] == len(labels) and not counted["per_token"]
    assert counted["majority"] == pytest.approx(np.bincount(labels).max() / len(labels))
    accuracy = record["metrics"][f"eval/{label}_accuracy"]
    assert accuracy == pytest.approx(right / len(labels), abs=1e-6)
    assert f"held-out sentence distance label accuracy: {accuracy:.4f} over 24 rows" in out


def test_sequence_length_flag_parses_pairs_and_json_and_names_a_bad_value():
    from lmsuite.cli import eval as eval_command

    assert eval_command._lengths("inputs:64,targets:16") == {"inputs": 64, "targets": 16}
    assert eval_command._lengths('{"input_ids": 32, "masked_ids": 5}') == {
        "input_ids": 32,
        "masked_ids": 5,
    }
    with pytest.raises(cli.ConfigError, match="--sequence_length='inputs=64'"):
        eval_command._lengths("inputs=64")


# ------------------------------------------------------------------------------ slow
def n_scored(targets, scores):  # a task's own score metric: it must run too
    return {"n_scored": float(len(scores))}


@pytest.mark.slow
def test_seq2seq_through_the_evaluator_equals_a_direct_computation(tmp_path):
    """prefix_lm on a tiny T5: the Evaluator path's loss, token and sequence accuracy equal a
    numpy computation from `LoadedModel.logits` over the same unpacked examples."""
    recipe = recipes.RECIPES["prefix_lm"]
    model_dir = tmp_path / "t5"
    assert cli.main(train_argv(recipe, "t5_tiny", model_dir, "--gin.train.final_eval=False")) == 0
    source = seqio.get_mixture_or_task("wiki_sample_prefix_lm")
    seqio.TaskRegistry.remove("prefix_lm_with_metric")
    seqio.TaskRegistry.add(
        "prefix_lm_with_metric",
        source=source.source,
        output_features=source.output_features,
        preprocessors=source.preprocessors,
        metric_fns=[n_scored],
    )
    result = evaluate.evaluate(
        model_dir=str(model_dir), task="prefix_lm_with_metric", batch_size=4, max_batches=2
    )
    assert result.path == "seqio.Evaluator" and result.num_examples == 8
    assert result.metrics["n_scored"] == 8.0
    with pytest.raises(ValueError, match="is a mixture of .*one task at a time"):
        evaluate.resolve(model_dir=str(model_dir), task="wiki_sample_seq2seq_mixture")

    model = lmsuite.load(str(model_dir))
    examples = seqio.get_dataset(
        "prefix_lm_with_metric",
        task_feature_lengths=recipe.lengths_for(64),
        dataset_split="validation",
        shuffle=False,
        num_epochs=1,
        seed=0,
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
    ).take(8)
    nll, right, tokens, whole = 0.0, 0, 0, []
    for ex in examples.as_numpy_iterator():
        inputs = ex["encoder_input_tokens"][None]
        logits = np.asarray(
            model.logits(
                input_ids=inputs,
                attention_mask=(inputs > 0).astype(np.int32),
                decoder_input_ids=ex["decoder_input_tokens"][None],
            ),
            np.float64,
        )[0]
        used = ex["decoder_loss_weights"] > 0
        targets = ex["decoder_target_tokens"]
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll -= logp[np.arange(len(targets)), targets][used].sum()
        hits = (logits.argmax(-1) == targets)[used]
        right, tokens = right + hits.sum(), tokens + used.sum()
        whole.append(hits.all())
    assert result.metrics["loss"] == pytest.approx(nll / tokens, rel=1e-4)
    assert result.metrics["token_accuracy"] == pytest.approx(right / tokens, abs=1e-9)
    assert result.metrics["sequence_accuracy"] == pytest.approx(np.mean(whole), abs=1e-9)
    seqio.TaskRegistry.remove("prefix_lm_with_metric")


def test_seq2seq_predictions_stop_at_the_targets_eos(monkeypatch):
    """Greedy predictions for a task's predict metrics end at its targets vocabulary's EOS
    (`</s>`, 6 in lmsuite's vocabulary; seqio's default id 1 is [UNK] there)."""
    from lmsuite.data import tasks  # noqa: F401  (registers wiki_sample_prefix_lm)
    from lmsuite.evaluation import decoding

    seen = {}

    def fake_generate(config, params, **kwargs):
        seen.update(kwargs)
        return np.zeros((kwargs["input_ids"].shape[0], 3), np.int64)

    monkeypatch.setattr(decoding, "generate", fake_generate)
    req = evaluate.EvalRequest(
        model_dir="unused", task="wiki_sample_prefix_lm", split="validation", step=1,
        recipe=recipes.RECIPES["prefix_lm"], sequence_length={}, model_config=ModelConfig(),
        params={}, batch_size=2, max_batches=None,
    )  # fmt: skip
    batch = {"encoder_input_tokens": np.ones((3, 4), np.int32),
             "decoder_target_tokens": np.ones((3, 5), np.int32)}  # fmt: skip
    dataset = tf.data.Dataset.from_tensor_slices(batch).enumerate()
    rows = seqio_scores.greedy_predict(req, dataset)
    assert [i for i, _ in rows] == [0, 1, 2]
    vocab = seqio.get_mixture_or_task("wiki_sample_prefix_lm").output_features["targets"]
    assert seen["eos_token_id"] == vocab.vocabulary.eos_id == 6
