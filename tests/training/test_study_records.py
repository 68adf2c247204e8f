"""A study's records on disk (`lmsuite.cli.study_records`): a run's wall time across the
processes that pretrained it, and which from-scratch baselines are one and the same."""

import json
import os

from lmsuite.cli import study_records as records


def test_a_runs_wall_time_adds_every_process_that_pretrained_it(tmp_path, monkeypatch):
    clock = iter([100.0, 500.0, 530.0])
    monkeypatch.setattr(records.time, "time", lambda: next(clock))
    metrics = tmp_path / "pretrain" / "metrics.jsonl"
    first = records.begin_segment(str(tmp_path), str(metrics))  # at 100 s; no metrics yet
    assert first == [{"start": 100.0}]
    metrics.parent.mkdir()
    metrics.write_text('{"step": 10}\n')
    os.utime(metrics, (140.0, 140.0))  # its last metric at 140 s, then the process is killed
    segments = records.begin_segment(str(tmp_path), str(metrics))  # resumed at 500 s
    assert segments == [{"start": 100.0, "end": 140.0}, {"start": 500.0}]
    assert records.end_segment(str(tmp_path), segments) == 40.0 + 30.0  # finished at 530 s
    written = json.loads((tmp_path / records.SEGMENTS_FILE).read_text())
    assert written == [{"start": 100.0, "end": 140.0}, {"start": 500.0, "end": 530.0}]


def test_a_scratch_baseline_is_shared_only_by_the_same_architecture_and_vocabulary(tmp_path):
    from types import SimpleNamespace

    from lmsuite.models.config import ModelConfig

    base = ModelConfig(vocab_size=100, d_model=16, num_heads=2, head_dim=8, d_ff=32)
    vocab = SimpleNamespace(template="cls_sep", proto=SimpleNamespace(
        SerializeToString=lambda deterministic: b"pieces"))  # fmt: skip
    key = records.scratch_key(SimpleNamespace(config=base, vocab=vocab))
    assert key == records.scratch_key(SimpleNamespace(config=base.replace(), vocab=vocab))
    others = [
        SimpleNamespace(config=base.replace(d_ff=64), vocab=vocab),
        SimpleNamespace(config=base, vocab=SimpleNamespace(template="none", proto=vocab.proto)),
        SimpleNamespace(config=base, vocab=None),
    ]
    assert len({key, *(records.scratch_key(m) for m in others)}) == 4

    def write(experiment, seed, **fields):
        path = tmp_path / "runs" / experiment / records.SCRATCH / f"seed{seed}"
        path.mkdir(parents=True)
        record = {"experiment": experiment, "probes": {"trec_questions": {}}, **fields}
        (path / records.RESULT_FILE).write_text(json.dumps(record))

    assert records.find_scratch(str(tmp_path), 0, key, besides="mass_tiny") is None  # no runs yet
    write("bart_tiny", 0, scratch_key=key)
    write("mass_tiny", 1, scratch_key=key, same_as="bart_tiny")  # reused: not a source
    write("t5_iid_tiny", 1, scratch_key="another architecture")
    assert records.find_scratch(str(tmp_path), 0, key, besides="mass_tiny")["experiment"] == (
        "bart_tiny"
    )
    assert records.find_scratch(str(tmp_path), 0, key, besides="bart_tiny") is None  # itself
    assert records.find_scratch(str(tmp_path), 1, key, besides="x_tiny") is None  # other seed
