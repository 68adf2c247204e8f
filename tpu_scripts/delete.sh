#!/usr/bin/env bash
# Deletes the TPU VM, or the queued resource together with its node (QUEUED=1).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
usage: tpu_scripts/delete.sh [--dry-run] [--help]

Deletes TPU_NAME without asking (--quiet): the VMs and their disks go; MODEL_DIR, on gs://,
stays. With QUEUED=1 it deletes QR_ID with --force, which deletes its node first.

  --dry-run   print the gcloud command ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help      this text
EOF_USAGE
}

parse_plain_options "$@"
load_config
check_node

if [[ $QUEUED == 1 ]]; then
  gcloud_run compute tpus queued-resources delete "$QR_ID" --zone="$ZONE" --force --quiet
else
  gcloud_run compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --quiet
fi
