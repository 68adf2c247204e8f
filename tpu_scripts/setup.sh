#!/usr/bin/env bash
# Installs lmsuite on every worker of the pod: clone REPO_URL at REPO_REF, a python3.11 .venv,
# and `pip install -e '.[tpu]'` (jax[tpu] and libtpu, pinned in setup.cfg, from PyPI).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
usage: tpu_scripts/setup.sh [--dry-run] [--help]

On every worker of TPU_NAME (--worker=all), in ~/lmsuite: clones REPO_URL (or re-points an
existing clone at it), checks out REPO_REF, creates .venv with python3.11 (installed with apt
when the image lacks it) and installs lmsuite with its `tpu` extra. Safe to run again: it
updates the checkout and the venv in place. Pin REPO_REF to a tag or commit, so workers that
set up at different times (after a recovery) run the same code.

  --dry-run   print the gcloud commands ("+ " and the quoted command), run none (or DRY_RUN=1)
  --help      this text
EOF
}

parse_plain_options "$@"
load_config
validate_setup

url="$(quote "$REPO_URL")"
ref="$(quote "$REPO_REF")"
# apt waits for the lock: a fresh VM runs unattended-upgrades for its first minutes.
apt="sudo apt-get -o DPkg::Lock::Timeout=600 -qq"
ssh_workers all "$(join_statements \
  "set -eu" \
  "if ! command -v python3.11 >/dev/null; then $apt update" \
  "$apt install -y python3.11 python3.11-venv" "fi" \
  "if [ ! -d \"$REMOTE_REPO/.git\" ]; then git clone --quiet $url \"$REMOTE_REPO\"; fi" \
  "cd \"$REMOTE_REPO\"" \
  "git remote set-url origin $url" \
  "git fetch --quiet origin $ref" \
  "git checkout --quiet --detach FETCH_HEAD" \
  "python3.11 -m venv .venv" \
  ".venv/bin/pip install --quiet --upgrade pip" \
  ".venv/bin/pip install --quiet -e '.[tpu]'")"
