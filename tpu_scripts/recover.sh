#!/usr/bin/env bash
# Recovers from preemption: a lost node (or queued resource) is deleted, recreated, set up and
# relaunched with the same training flags; with --watch it keeps doing so until training ends.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
usage: tpu_scripts/recover.sh [--watch] [--dry-run] [--help] [-- TRAIN_FLAGS...]

Reads the state of TPU_NAME (QUEUED=1: of QR_ID). When it is lost (PREEMPTED or TERMINATED;
for a queued resource FAILED or SUSPENDED), runs delete.sh, create.sh (which waits for a queued
resource to become ACTIVE), setup.sh and launch.sh -- TRAIN_FLAGS. Training resumes from the
newest checkpoint in MODEL_DIR: lmsuite restores it itself. Pass the TRAIN_FLAGS you gave
launch.sh, so the relaunch is the same run.

--watch repeats that every POLL_SECONDS and also reads worker 0's training status:
  running          wait
  not-started      launch
  exited 0         stop, exit 0
  exited 143       relaunch (SIGTERM reached training but the node survived)
  exited other     stop, exit with that status (a configuration error or a NaN loss does
                   not heal by retrying; see tpu_scripts/logs.sh)
A dry run reads the state from LMSUITE_FAKE_STATE (e.g. PREEMPTED) and watches one round.

  --watch     keep watching until training ends
  --dry-run   print the gcloud commands ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help      this text
EOF_USAGE
}

watch=0
while (($#)); do
  case $1 in
    -h | --help) usage && exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --watch) watch=1 ;;
    --) shift && break ;;
    *) unknown_option "$1" "--watch --dry-run --help, then -- TRAIN_FLAGS" ;;
  esac
  shift
done
load_config
# Everything recovery will need, checked now: a typo must not surface after the delete.
validate_create
validate_setup
validate_launch "$@"

here="$(dirname "${BASH_SOURCE[0]}")"

# TRAINING and TRAINING_EXIT from worker 0. Workers stop together (a lost peer stalls the
# rest's collectives), so worker 0 speaks for all.
read_training() {
  local out
  if dry_run; then
    ssh_workers 0 "$(remote_status_script)"
    TRAINING=unknown TRAINING_EXIT=none
    return 0
  fi
  out="$(ssh_workers 0 "$(remote_status_script)")"
  [[ $out =~ training=([a-z-]+)\ exit_status=([0-9a-z]+) ]] ||
    die "could not read the training state from worker 0 of $TPU_NAME; it printed: $out"
  TRAINING="${BASH_REMATCH[1]}" TRAINING_EXIT="${BASH_REMATCH[2]}"
}

# Sets UP=1 when the node is up (after recovering it if it was lost), 0 while it is in between.
# It reports through UP, not its status: bash ignores `set -e` inside a function whose status
# an `if` tests, and a failed delete must stop everything after it.
recover_once() {
  UP=0
  read_state
  if dry_run && [[ -z $STATE ]]; then
    note "dry run: no LMSUITE_FAKE_STATE; set it (e.g. PREEMPTED) to print the recovery path"
  elif state_is_lost "$STATE"; then
    note "$(resource_label) is $STATE: recreating it and relaunching training"
    "$here/delete.sh"
    "$here/create.sh"
    "$here/setup.sh"
    "$here/launch.sh" -- "$@"
    UP=1
  elif state_is_ready "$STATE"; then
    note "$(resource_label) is $STATE: nothing to recover"
    UP=1
  else
    note "$(resource_label) is $STATE: waiting"
  fi
}

if ((!watch)); then
  recover_once "$@"
  exit 0
fi
while true; do
  recover_once "$@"
  if ((UP)); then
    read_training
    case $TRAINING:$TRAINING_EXIT in
      running:*) ;;
      not-started:*) "$here/launch.sh" -- "$@" ;;
      exited:0)
        note "training on $TPU_NAME finished (exit status 0)"
        exit 0
        ;;
      exited:143) "$here/launch.sh" -- "$@" ;;
      exited:*)
        echo "$SCRIPT_NAME: training on $TPU_NAME exited with status $TRAINING_EXIT; not" \
          "relaunching (tpu_scripts/logs.sh shows why)" >&2
        exit "$TRAINING_EXIT"
        ;;
      unknown:*) ;;  # dry run
    esac
  fi
  if dry_run; then
    note "dry run: one round; --watch polls every ${POLL_SECONDS}s"
    exit 0
  fi
  sleep "$POLL_SECONDS"
done
