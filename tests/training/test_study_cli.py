"""`lmsuite study`: its flags checked at once, the protocol a resumed study must keep, budgets
turned into steps, a killed study that resumes without redoing finished runs (fast: it is the
fast suite's end-to-end run of the bert_mlm_nsp row, `test_recipes.TRAINED_BY_TEST`), and (slow)
the from-scratch baselines and a toy study of every default objective."""

import json
import os
import shlex
import shutil

import pytest

import lmsuite
from lmsuite import cli
from lmsuite.cli import study
from lmsuite.cli import study_records as records
from lmsuite.evaluation import probe_sweep, study_report
from lmsuite.training.step_cost import StepCost
from tests.training.cli_errors import problem_lines

TOY = ["--probes=trec_questions", "--probe_learning_rates=1e-3", "--probe_epochs=1",
       "--probe_max_train=64", "--probe_max_length=32", "--no_progress"]  # fmt: skip


@pytest.fixture
def sweeps(monkeypatch) -> list[bool]:
    """Each probe sweep's `from_scratch`, in the order the study ran them (the sweeps run)."""
    calls = []
    real_sweep = probe_sweep.sweep

    def spy(model, probe, **kwargs):
        calls.append(kwargs["from_scratch"])
        return real_sweep(model, probe, **kwargs)

    monkeypatch.setattr(probe_sweep, "sweep", spy)
    return calls


def test_every_bad_flag_is_listed_at_once(tmp_path, capsys):
    code = cli.main(["study", f"--out={tmp_path}/s", "--experiments=bert_tiny,bert_tniy",
                     "--flops=1e12,lots", "--tokens=5", "--probes=trec_questions,glue",
                     "--seeds=0", "--probe_learning_rates=-1"])  # fmt: skip
    assert code == 2
    lines = "\n".join(problem_lines(capsys.readouterr().err))
    for expected in ("exactly one of --flops and --tokens", "unknown experiment 'bert_tniy'",
                     "--flops: 'lots' is not a number", "unknown probe 'glue'",
                     "--seeds must be an integer >= 1, got 0",
                     "--probe_learning_rates: '-1' must be a finite number > 0"):  # fmt: skip
        assert expected in lines
    assert not os.path.exists(tmp_path / "s")


def test_a_resumed_study_must_keep_its_protocol(tmp_path, capsys):
    args = cli.parse_args(["study", f"--out={tmp_path}", "--flops=1e12", *TOY])
    protocol = study.parse_settings(args)[0]
    study.check_protocol(str(tmp_path), protocol)
    study.check_protocol(str(tmp_path), protocol)  # the same: accepted
    args = cli.parse_args(["study", f"--out={tmp_path}", "--flops=1e12", *TOY,
                           "--probe_epochs=2", "--gin.ModelConfig.d_model=32"])  # fmt: skip
    with pytest.raises(cli.ConfigError) as error:
        study.check_protocol(str(tmp_path), study.parse_settings(args)[0])
    text = str(error.value.problems)
    assert "probe_epochs: the study in" in text and "has 1, the flags give 2" in text
    assert "bindings" in text and "ModelConfig.d_model = 32" in text


class _Run:
    """What `plan_steps` reads of a TrainConfig."""

    class checkpointing:  # noqa: N801
        model_dir = "runs/x"

    class trainer:  # noqa: N801
        train_steps = 2000

    class optimizer:  # noqa: N801
        class learning_rate:  # noqa: N801
            warmup_steps = 100

    class data:  # noqa: N801
        stages = ()


def test_budgets_become_whole_steps_within_five_percent():
    cost = StepCost(flops=4.0e9, tokens=4096, params=10)
    plan = study.plan_steps(_Run, cost, budget=1.0e12, match="flops")
    assert plan == {"steps": 250, "warmup_steps": 12, "flops": 1.0e12, "tokens": 250 * 4096}
    plan = study.plan_steps(_Run, cost, budget=4096 * 30.4, match="tokens")
    assert plan["steps"] == 30 and abs(plan["tokens"] - 4096 * 30.4) / (4096 * 30.4) < 0.05
    with pytest.raises(cli.ConfigError, match=r"1.60 steps .* miss it by 25.0%"):
        study.plan_steps(_Run, cost, budget=6.4e9, match="flops")


def test_a_killed_study_resumes_without_redoing_finished_runs(tmp_path, monkeypatch, capsys):
    # bert_tiny at batch 8: 20 steps; two seeds, no scratch baselines
    argv = ["study", f"--out={tmp_path}", "--experiments=bert_tiny", "--seeds=2",
            f"--flops={20 * 1.17e9:.4g}", "--no_scratch", "--gin.BATCH_SIZE=8",
            "--gin.train.eval_batches=2", *TOY]  # fmt: skip
    real_sweep = probe_sweep.sweep
    sweeps = []

    def killed_in_the_second_run(model, probe, **kwargs):
        sweeps.append(kwargs["seed"])
        if kwargs["seed"] == 1:
            raise KeyboardInterrupt  # the study is killed while seed 1 fine-tunes
        return real_sweep(model, probe, **kwargs)

    monkeypatch.setattr(probe_sweep, "sweep", killed_in_the_second_run)
    with pytest.raises(KeyboardInterrupt):
        cli.main(argv)
    first = tmp_path / "runs" / "bert_tiny" / records.budget_label(20 * 1.17e9) / "seed0"
    second = first.parent / "seed1"
    assert (first / "result.json").exists() and not (second / "result.json").exists()
    finished = (first / "result.json").stat().st_mtime_ns
    pretrained = (second / "pretrain" / "metrics.jsonl").read_text()

    trained = []
    real_train = lmsuite.train
    monkeypatch.setattr(probe_sweep, "sweep", real_sweep)
    monkeypatch.setattr(lmsuite, "train", lambda run: trained.append(run) or real_train(run))
    assert cli.main(argv) == 0
    assert (first / "result.json").stat().st_mtime_ns == finished  # read back, not redone
    assert len(trained) == 1  # only seed 1's, which finds its last checkpoint and stops there
    # no step trained again: the resumed run only marks that it resumed at its last step
    added = (second / "pretrain" / "metrics.jsonl").read_text().removeprefix(pretrained)
    assert [json.loads(line) for line in added.splitlines()] == [{"step": 20, "resumed": True}]
    results = [json.loads((d / "result.json").read_text()) for d in (first, second)]
    for record in results:
        assert record["steps"] == 20
        assert abs(record["flops"] - 20 * 1.17e9) / (20 * 1.17e9) < 0.05
        assert 0 <= record["probes"]["trec_questions"]["test_accuracy"] <= 1
    report = (tmp_path / study_report.REPORT_FILE).read_text()
    assert "| bert_tiny | bert_mlm_nsp | 2.34e+10 flops | 2 |" in report

    # Exported without checkpoints, the records resume elsewhere with nothing trained again.
    exported = tmp_path.parent / f"{tmp_path.name}_exported"
    assert cli.main(["study", f"--out={tmp_path}", f"--export={exported}"]) == 0
    assert not list(exported.rglob("checkpoints")) and not list(exported.rglob("*.tfevents*"))
    assert all((exported / name).is_file() for name in study_report.FILES)
    assert (exported / first.relative_to(tmp_path) / "pretrain" / "config.gin").exists()
    monkeypatch.setattr(lmsuite, "train", lambda run: pytest.fail("trained an exported run"))
    argv[argv.index(f"--out={tmp_path}")] = f"--out={exported}"
    assert cli.main(argv) == 0
    report = (exported / study_report.REPORT_FILE).read_text()
    assert "| bert_tiny | bert_mlm_nsp | 2.34e+10 flops | 2 |" in report


@pytest.mark.slow
def test_the_from_scratch_baseline_fine_tunes_the_untrained_architecture(tmp_path, sweeps):
    calls = sweeps
    argv = ["study", f"--out={tmp_path}", "--experiments=bert_tiny", "--seeds=1",
            f"--flops={20 * 1.17e9:.4g}", "--gin.BATCH_SIZE=8", "--gin.train.eval_batches=2",
            *TOY]  # fmt: skip
    assert cli.main(argv) == 0
    assert calls == [False, True]  # the pretrained run, then the baseline
    scratch = tmp_path / "runs" / "bert_tiny" / records.SCRATCH / "seed0"
    first = json.loads((scratch / "result.json").read_text())
    # The baseline reads no checkpoint: without the pretrained run's, it runs again alike.
    shutil.rmtree(scratch)
    pretrained = scratch.parent.parent / records.budget_label(20 * 1.17e9) / "seed0"
    shutil.rmtree(pretrained / "pretrain" / "checkpoints")
    assert cli.main(argv) == 0
    assert calls == [False, True, True]
    record = json.loads((scratch / "result.json").read_text())
    again, before = record["probes"]["trec_questions"], first["probes"]["trec_questions"]
    assert again["test_accuracy"] == before["test_accuracy"]  # the same seed's architecture
    assert record["budget"] is None and record["steps"] == 0 and record["flops"] == 0.0
    report = (tmp_path / study_report.REPORT_FILE).read_text()
    assert "| bert_tiny | bert_mlm_nsp | none (scratch) | 1 |" in report
    assert f"Produced by `{shlex.join(['lmsuite', *argv])}`." in report  # how to run it again


TOY_FLOPS = 4.5e11  # >= 20 steps of the costliest default experiment's step (2.1e10)


@pytest.mark.slow
def test_a_toy_study_of_every_default_objective_spends_its_budget(tmp_path, capsys):
    argv = ["study", f"--out={tmp_path}", "--seeds=1", f"--flops={TOY_FLOPS:g}",
            "--no_scratch", "--gin.train.eval_batches=2", *TOY]  # fmt: skip
    assert cli.main(argv) == 0
    experiments = study.DEFAULT_EXPERIMENTS.split(",")
    report = (tmp_path / study_report.REPORT_FILE).read_text()
    for experiment in experiments:
        path = tmp_path / "runs" / experiment / records.budget_label(TOY_FLOPS) / "seed0"
        record = json.loads((path / "result.json").read_text())
        assert abs(record["flops"] - TOY_FLOPS) / TOY_FLOPS <= study.MAX_BUDGET_ERROR
        assert record["steps"] == round(TOY_FLOPS / record["flops_per_step"])
        assert record["held_out"], experiment  # its own held-out pretraining metric
        accuracy = record["probes"]["trec_questions"]["test_accuracy"]
        assert 0 <= accuracy <= 1
        assert f"| {experiment} | {record['recipe']} | 4.5e+11 flops | 1 |" in report
    assert (tmp_path / study_report.PLOT_FILE).stat().st_size > 10_000
    print(report)


def test_every_run_is_planned_before_any_trains(tmp_path, monkeypatch, capsys):
    """A budget too small for one experiment's step, and a staged experiment, are refused
    together before anything trains; nothing is written."""
    monkeypatch.chdir(tmp_path)
    args = cli.parse_args(["study", f"--out={tmp_path}/s", "--flops=1e11", *TOY])
    protocol = study.parse_settings(args)[0]
    with pytest.raises(cli.ConfigError) as error:
        study.plan_study(["bert_tiny", "t5_prefix_lm_tiny", "ernie2_tiny"], [1e11], protocol)
    problems = error.value.problems
    assert len(problems) == 2, problems
    assert problems[0].startswith("t5_prefix_lm_tiny: a budget of 1e+11 flops is 4.7")
    assert problems[1].startswith("ernie2_tiny: ") and "continual schedule" in problems[1]
    planned = study.plan_study(["bert_tiny"], [1e11, 4e11], protocol)["bert_tiny"]
    assert [p["steps"] for p in planned["plans"].values()] == [21, 86]  # 4.66e9 per step
    assert "bert_tiny" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_experiments_of_one_architecture_share_their_scratch_baseline(
    tmp_path, monkeypatch, sweeps
):
    calls = sweeps
    argv = ["study", f"--out={tmp_path}", "--experiments=bart_tiny,mass_tiny", "--seeds=1",
            f"--flops={TOY_FLOPS:g}", "--gin.train.eval_batches=2", *TOY]  # fmt: skip
    assert cli.main(argv) == 0
    assert calls == [False, False, True]  # two pretrained runs, one baseline
    runs = tmp_path / "runs"
    bart = json.loads((runs / "bart_tiny" / records.SCRATCH / "seed0" / "result.json").read_text())
    path = runs / "mass_tiny" / records.SCRATCH / "seed0" / "result.json"
    mass = json.loads(path.read_text())
    assert mass["same_as"] == "bart_tiny" and mass["probes"] == bart["probes"]
    assert mass["scratch_key"] == bart["scratch_key"] and mass["experiment"] == "mass_tiny"
    # Trained for itself, mass_tiny's baseline scores what bart_tiny's did.
    path.unlink()
    monkeypatch.setattr(records, "find_scratch", lambda *args, **kwargs: None)
    assert cli.main(argv) == 0
    assert calls == [False, False, True, True]
    alone = json.loads(path.read_text())["probes"]["trec_questions"]
    assert alone["test_accuracy"] == bart["probes"]["trec_questions"]["test_accuracy"]


def test_the_time_left_counts_each_run_as_its_own_kind():
    spent = {("bert_tiny", 1e12): [100.0, 120.0], ("bert_tiny", 4e12): [400.0],
             ("bert_tiny", None): [10.0]}  # fmt: skip
    rest = [("bert_tiny", 1e12, 2),  # its own mean: 110
            ("electra_tiny", 4e12, 1),  # its budget's: 400
            ("electra_tiny", None, 1),  # the baselines': 10
            ("electra_tiny", 9e12, 0)]  # a budget not run yet: every run's, 157.5  # fmt: skip
    assert study.seconds_left(rest, spent) == pytest.approx(110 + 400 + 10 + 157.5)
    assert study.seconds_left([], spent) is None and study.seconds_left(rest, {}) is None
