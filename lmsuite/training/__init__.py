"""The only package that joins model, objective and data: the recipes that pair them, the
preflight checks, optimizers, schedules, the sharded train state and step, checkpoints, input,
metrics and the loop.

Typical use without gin (a notebook): one `TrainConfig` of frozen groups, trained by
`lmsuite.train` (`loop.train`), which checks it and writes run.json first:

    import lmsuite
    from lmsuite.training.train_config import (CheckpointConfig, DataConfig, OptimizerConfig,
                                                ScheduleConfig, TrainConfig, TrainerConfig)
    run = TrainConfig(
        data=DataConfig(task="wiki_sample_bert_mlm", batch_size=32,
                        sequence_length={"input_ids": 128, "masked_ids": 20}),
        model=config, recipe="bert_mlm",
        optimizer=OptimizerConfig(name="adamw",
                                  learning_rate=ScheduleConfig(peak_value=1e-3, warmup_steps=50)),
        trainer=TrainerConfig(train_steps=500),
        checkpointing=CheckpointConfig(model_dir="runs/x"))
    result = lmsuite.train(run)

or from gin files, as `lmsuite train` builds it: `lmsuite.run_from_gin("experiments/smoke.gin",
model_dir="runs/x", bindings={"TRAIN_STEPS": 100})`.
"""
