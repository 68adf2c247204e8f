#!/usr/bin/env bash
# Follows the training log of one worker of the pod, or of all of them.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
usage: tpu_scripts/logs.sh [--worker=K|all] [--lines=N] [--dry-run] [--help]

Shows the last N lines (default 100) of ~/lmsuite-train.log on worker K (default 0) and follows
it (tail -F: it waits for the file and survives a relaunch); Ctrl-C stops following, not
training. With --worker=all every line starts with its worker's hostname.

  --worker=K|all  which worker (0-based), or all of them
  --lines=N       lines of history to show first
  --dry-run       print the gcloud command ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help          this text
EOF_USAGE
}

worker=0 lines=100
while (($#)); do
  case $1 in
    -h | --help) usage && exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --worker=*) worker="${1#*=}" ;;
    --lines=*) lines="${1#*=}" ;;
    *) unknown_option "$1" "--worker=K|all --lines=N --dry-run --help" ;;
  esac
  shift
done
load_config
check_node
[[ $worker == all || $worker =~ ^[0-9]+$ ]] ||
  die "--worker=$worker: expected a worker index (0, 1, ...) or all"
[[ $lines =~ ^[0-9]+$ ]] || die "--lines=$lines: expected a number of lines"

follow="tail -n $lines -F \"$REMOTE_LOG\""
if [[ $worker == all ]]; then
  # Lines from all workers arrive interleaved; the prefix says whose each is.
  follow="$follow | sed -u \"s/^/\$(hostname): /\""
fi
ssh_workers "$worker" "$follow"
