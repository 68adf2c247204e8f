"""`benchmarks/train_loop.py`'s bare step builds for the runs the loop trains: it had failed on a
mixture's label heads and on a carried state (XLNet's memory), each found only when run."""

import pytest

from tests.benchmarks import scripts


@pytest.fixture(scope="module")
def train_loop():
    return scripts.load("train_loop")


@pytest.mark.parametrize(
    "gin_file, bindings",
    [
        (  # memory carried from step to step, from zeros
            "experiments/xlnet_tiny.gin",
            [
                "--gin.BATCH_SIZE=8",  # the suite runs on 8 virtual devices
                "--gin.SEQUENCE_LENGTH={'input_k': 32, 'target': 5}",
                "--gin.XLNetOptions.mem_len=8",
                "--gin.XLNetOptions.reuse_len=16",
            ],
        ),
        (  # a mixture: each task's rows carry -1 for the other tasks' labels
            "experiments/bert_multitask_tiny.gin",
            [
                "--gin.BATCH_SIZE=8",
                "--gin.SEQUENCE_LENGTH={'input_ids': 32, 'masked_ids': 5}",
                "--gin.train.shuffle_buffer_size=16",
            ],
        ),
    ],
)
def test_bare_step_builds_and_runs(train_loop, gin_file, bindings):
    from lmsuite import cli

    args = cli.parse_args(["train", f"--gin_file={gin_file}", "--model_dir=/unused", *bindings])
    measure = train_loop.bare_step_measurer(cli.load_run(args))
    assert measure(2) > 0
