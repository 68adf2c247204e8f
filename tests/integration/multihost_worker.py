"""One process of the multi-host test: a few sharded train steps of the tiny model.

  python -m tests.integration.multihost_worker OUT.json [PROCESS_ID NUM_PROCESSES PORT]

Without the last three arguments it runs alone (the reference). The global batch is the same
either way; each process contributes its own rows via `make_array_from_process_local_data`.
"""

import json
import sys

import jax


def main(argv):
    out = argv[0]
    if len(argv) > 1:
        process_id, num_processes, port = (int(a) for a in argv[1:4])
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"localhost:{port}",
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=120,
        )
    from lmsuite import partitioning
    from lmsuite.training import input_pipeline
    from tests.training import tiny

    mesh = partitioning.make_mesh(data=-1)
    state, run, batch_sharding, _ = tiny.build(mesh=mesh)
    rows = 8 // jax.process_count()
    first = jax.process_index() * rows
    losses = []
    for i in range(4):
        batch = tiny.mlm_batch(batch_size=8, seed=i)
        local = {k: v[first : first + rows] for k, v in batch.items()}
        state, metrics = run(
            state, input_pipeline.to_global(local, batch_sharding), jax.random.PRNGKey(3)
        )
        losses.append(float(metrics["loss"]))
    if jax.process_index() == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "devices": jax.device_count()}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
