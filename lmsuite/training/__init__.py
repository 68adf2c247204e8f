"""The only package that joins model, objective and data: the recipes that pair them, the
preflight checks, optimizers, schedules, the sharded train state and step, checkpoints, input,
metrics and the loop.

Typical use without gin (a notebook):

    from lmsuite.training import loop, optimizers, recipes, schedules
    schedule = schedules.make_schedule(name="linear", peak_value=1e-3, warmup_steps=50,
                                       total_steps=500)
    loop.train(model_dir="runs/x", model_config=config, task="wiki_sample_bert_mlm",
               sequence_length={"input_ids": 128, "masked_ids": 20},
               recipe=recipes.make_recipe(name="bert_mlm"),
               optimizer=optimizers.make_optimizer(name="adamw", learning_rate=schedule),
               learning_rate_fn=schedule, batch_size=32, train_steps=500)
"""
