#!/usr/bin/env bash
# Starts `lmsuite train` on all hosts at once. `--distributed` makes every process call
# jax.distributed.initialize(), which on TPU VMs finds the coordinator and its peers itself;
# each host then reads its own SeqIO shard and the mesh spans all chips of the pod.
# MODEL_DIR must be shared by all hosts (a gs:// bucket); a preempted pod gets SIGTERM, saves a
# checkpoint, exits 143, and the same command resumes it.
#   DRY_RUN=1 MODEL_DIR=gs://BUCKET/run1 tpu_scripts/launch.sh \
#     --gin_file=experiments/default.gin --gin.MESH_SHAPE='(-1, 4, 1)'
set -euo pipefail
source "$(dirname "$0")/common.sh"
: "${MODEL_DIR:?set MODEL_DIR to a gs:// path shared by all hosts}"

args=""
for a in "$@"; do args+=" $(printf '%q' "$a")"; done
on_all_hosts "cd lmsuite && .venv/bin/lmsuite train --distributed --model_dir=$MODEL_DIR$args \
  2>&1 | tee -a \$HOME/lmsuite-train.log"
