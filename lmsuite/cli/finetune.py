"""`lmsuite finetune`: fine-tune a pretrained model on a classification probe (any family, read
as `evaluation/probe_models.py` says) or SQuAD (encoders).

lmsuite finetune --model_dir=RUN | --hf_dir=DIR
                 --task=vader_sentiment | trec_questions | glue_tsv | squad
                 [--train_file=F --validation_file=G [--test_file=T]] --output_dir=OUT
                 [--epochs --learning_rate --batch_size --max_length --seed --from_scratch]

Writes OUT/metrics.json (final and per-epoch metrics), OUT/params.npz (the fine-tuned
parameters, "a/b/c" keys) and OUT/model_config.json; the last line printed is the held-out
accuracy (or EM/F1); with --test_file (glue_tsv) the line before it is the test accuracy.
"""

import json
import math
import os

import numpy as np

from lmsuite.cli.config import ConfigError, described

TASKS = ("vader_sentiment", "trec_questions", "glue_tsv", "squad")
DEFAULT_LEARNING_RATE = {"squad": 5e-5}  # BERT's SQuAD rate; 2e-5 for the classifiers


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "finetune",
        **described(
            "fine-tune a pretrained model on a probe (vader_sentiment, trec_questions), a "
            "GLUE-format TSV or SQuAD-format JSON; writes metrics.json and the parameters"
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model_dir", help="an lmsuite run directory (newest checkpoint)")
    source.add_argument("--hf_dir", help="a HF directory with config.json and tokenizer.json")
    parser.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    parser.add_argument("--train_file", default=None, help="glue_tsv: TSV; squad: JSON")
    parser.add_argument("--validation_file", default=None, help="glue_tsv: TSV; squad: JSON")
    parser.add_argument(
        "--test_file", default=None, help="glue_tsv: a TSV scored once with the final parameters"
    )
    parser.add_argument("--text_column", default=None, help="glue_tsv (default: GLUE's names)")
    parser.add_argument("--pair_column", default=None, help="glue_tsv second text, if any")
    parser.add_argument("--label_column", default=None, help="glue_tsv (default: label)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--learning_rate", type=float, default=None, help="default 2e-5 (squad: 5e-5)"
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--doc_stride", type=int, default=64, help="squad: window stride")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--from_scratch",
        action="store_true",
        help="the same architecture from random initialisation (the no-pretraining baseline)",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run_finetune)


def _write(result, output_dir: str) -> None:
    from flax import traverse_util

    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
        json.dump({"final": result.metrics, "history": result.history}, f, indent=1)
    flat = traverse_util.flatten_dict(result.params, sep="/")
    np.savez(os.path.join(output_dir, "params.npz"), **{k: np.asarray(v) for k, v in flat.items()})
    with open(os.path.join(output_dir, "model_config.json"), "w") as f:
        json.dump(result.config.to_json(), f, indent=1)


def run_finetune(args):
    from lmsuite.evaluation import finetune, finetune_data, qa, squad

    if args.task not in TASKS:
        raise ConfigError([f"unknown --task {args.task!r}; expected one of {list(TASKS)}"])
    problems = [
        f"--{flag} must be an integer >= 1, got {getattr(args, flag)}"
        for flag in ("epochs", "batch_size", "max_length", "doc_stride")
        if getattr(args, flag) < 1
    ]
    rate = args.learning_rate
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        problems.append(f"--learning_rate must be a finite number > 0, got {rate}")
    if problems:
        raise ConfigError(problems)
    source = args.model_dir or args.hf_dir
    learning_rate = args.learning_rate or DEFAULT_LEARNING_RATE.get(args.task, 2e-5)
    settings = dict(
        learning_rate=learning_rate,
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_length=args.max_length,
        seed=args.seed,
        from_scratch=args.from_scratch,
        progress=not args.no_progress,
    )
    try:  # bad inputs are reported as configuration errors, before anything trains
        if args.task == "squad":
            if not args.train_file or not args.validation_file:
                raise ValueError("--task=squad needs --train_file and --validation_file (JSON)")
            data = dict(
                train=squad.read_squad(args.train_file),
                validation=squad.read_squad(args.validation_file),
            )
        else:
            train, validation, labels = finetune_data.classification_data(
                args.task,
                train_file=args.train_file,
                validation_file=args.validation_file,
                text_column=args.text_column,
                pair_column=args.pair_column,
                label_column=args.label_column,
            )
            data = dict(train=train, validation=validation, num_labels=len(labels))
            if args.test_file:
                if args.task != "glue_tsv":
                    raise ValueError(f"--test_file is for --task=glue_tsv, not {args.task!r}")
                data["test"], _ = finetune_data.read_glue_tsv(
                    args.test_file,
                    text_column=args.text_column,
                    pair_column=args.pair_column,
                    label_column=args.label_column,
                    label_names=labels,
                )
        if not (args.task == "squad" and qa.is_hf_qa_dir(source)):
            source = finetune.open_model(source)
    except ValueError as error:
        raise ConfigError([str(error)]) from error
    if args.task == "squad":
        result = qa.finetune_qa(source, doc_stride=args.doc_stride, **data, **settings)
    else:
        result = finetune.finetune_classifier(source, **data, **settings)
        result.metrics["labels"] = list(labels)
    _write(result, args.output_dir)
    m = result.metrics
    print(f"  metrics: {args.output_dir}/metrics.json  params: {args.output_dir}/params.npz")
    if args.task == "squad":
        print(f"held-out exact match {m['exact_match']:.2f}  F1 {m['f1']:.2f}")
    else:
        if "test_accuracy" in m:
            print(
                f"test accuracy {m['test_accuracy']:.4f} (majority class "
                f"{m['test_majority_class_share']:.4f}, {m['test_examples']} examples)"
            )
        print(
            f"held-out accuracy {m['validation_accuracy']:.4f} (majority class "
            f"{m['majority_class_share']:.4f}, {m['validation_examples']} examples)"
        )
    return result
