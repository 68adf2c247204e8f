#!/usr/bin/env bash
# Creates the TPU VM, or queues a request for it (QUEUED=1) and waits until it is ACTIVE.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
usage: tpu_scripts/create.sh [--dry-run] [--help]

Creates TPU_NAME with ACCELERATOR in ZONE, from the environment or pod.env:
  QUEUED=0  gcloud compute tpus tpu-vm create (returns when the VM is READY)
  QUEUED=1  gcloud compute tpus queued-resources create QR_ID --node-id=TPU_NAME, then polls
            every POLL_SECONDS until it is ACTIVE, for at most QUEUE_TIMEOUT_SECONDS
PROVISIONING=on-demand|spot|reserved adds nothing, --spot or --reserved. RUNTIME defaults to
the base image for the generation: tpu-ubuntu2204-base (v3, v4), v2-alpha-tpuv5-lite (v5e),
v2-alpha-tpuv5 (v5p). The zone must offer the generation (LMSUITE_SKIP_ZONE_CHECK=1 skips that).

  --dry-run   print the gcloud commands ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help      this text
EOF
}

parse_plain_options "$@"
load_config
validate_create

wait_until_active() {
  local start=$SECONDS
  while true; do
    read_state
    if dry_run; then
      note "dry run: polls every ${POLL_SECONDS}s until $QR_ID is ACTIVE (at most" \
        "${QUEUE_TIMEOUT_SECONDS}s)"
      return 0
    fi
    case $STATE in
      ACTIVE) return 0 ;;
      FAILED | SUSPENDED) die "queued resource $QR_ID is $STATE; tpu_scripts/status.sh shows it" ;;
    esac
    if ((SECONDS - start >= QUEUE_TIMEOUT_SECONDS)); then
      die "queued resource $QR_ID is still $STATE after ${QUEUE_TIMEOUT_SECONDS}s" \
        "(QUEUE_TIMEOUT_SECONDS); it stays in the queue until tpu_scripts/delete.sh removes it"
    fi
    echo "$SCRIPT_NAME: $QR_ID is $STATE; next look in ${POLL_SECONDS}s" >&2
    sleep "$POLL_SECONDS"
  done
}

# Both create commands spell the three modes the same way.
case $PROVISIONING in
  on-demand) provisioning=() ;;
  spot) provisioning=(--spot) ;;
  reserved) provisioning=(--reserved) ;;
esac
if [[ $QUEUED == 1 ]]; then
  gcloud_run compute tpus queued-resources create "$QR_ID" --node-id="$TPU_NAME" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR" --runtime-version="$RUNTIME" "${provisioning[@]}"
  wait_until_active
else
  gcloud_run compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR" --version="$RUNTIME" "${provisioning[@]}"
fi
