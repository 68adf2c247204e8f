#!/usr/bin/env bash
# Reports the node's (or the queued resource's) state and, on each worker, whether training
# runs and the exit status it recorded.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
usage: tpu_scripts/status.sh [--dry-run] [--help]

Prints the state of TPU_NAME (READY, PREEMPTED, ...; with QUEUED=1 that of QR_ID: ACTIVE,
WAITING_FOR_RESOURCES, SUSPENDED, ...), then, when it is up, one line per worker:
  HOST training=running|exited|not-started exit_status=CODE|none
where CODE is what launch.sh recorded: 0 done, 2 configuration error, 3 NaN loss, 143 preempted.
A dry run takes the state from LMSUITE_FAKE_STATE (default: up).

  --dry-run   print the gcloud commands ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help      this text
EOF_USAGE
}

parse_plain_options "$@"
load_config
check_node

read_state
if dry_run && [[ -z $STATE ]]; then  # print the whole report: take the node as up
  if [[ $QUEUED == 1 ]]; then STATE=ACTIVE; else STATE=READY; fi
fi
echo "$(resource_label): $STATE"
if state_is_ready "$STATE"; then
  ssh_workers all "$(remote_status_script)"
else
  echo "workers not reachable while $STATE; tpu_scripts/recover.sh recovers a lost node"
fi
