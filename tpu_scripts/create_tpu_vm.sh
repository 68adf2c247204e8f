#!/usr/bin/env bash
# Creates a TPU VM (a single host such as v3-8, or a pod slice such as v4-32).
#   DRY_RUN=1 ACCELERATOR=v3-32 ZONE=europe-west4-a RUNTIME=tpu-vm-base tpu_scripts/create_tpu_vm.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

run gcloud compute tpus tpu-vm create "$TPU_NAME" \
  --zone="$ZONE" --accelerator-type="$ACCELERATOR" --version="$RUNTIME"
