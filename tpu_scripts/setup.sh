#!/usr/bin/env bash
# Installs lmsuite on every worker of the pod: clone REPO_URL at REPO_REF, a .venv on the image's
# own Python when lmsuite supports it (3.11-3.13), and the README's TPU VM install from the clone
# with the exact versions of constraints.txt (jax[tpu] and its libtpu, from PyPI).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
usage: tpu_scripts/setup.sh [--dry-run] [--help]

On every worker of TPU_NAME (--worker=all), in ~/lmsuite: clones REPO_URL (or re-points an
existing clone at it), checks out REPO_REF, creates .venv with the image's python3 when it is
3.11-3.13 (else python3.13, 3.12 or 3.11 if present, else python3.11 from apt) and installs
lmsuite with its `tpu` extra and constraints.txt's versions. Safe to run again: it
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
# The first interpreter lmsuite supports: the image's python3 first (Ubuntu 24.04's is 3.12;
# 22.04's 3.10 is too old, and then apt's python3.11 is used).
supported="import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))"
ssh_workers all "$(join_statements \
  "set -eu" \
  "py=\$(for c in python3 python3.13 python3.12 python3.11; do if command -v \$c >/dev/null && \$c -c '$supported'; then echo \$c; break; fi; done)" \
  "if [ -z \"\$py\" ]; then $apt update" \
  "$apt install -y python3.11 python3.11-venv" "py=python3.11" "fi" \
  "echo \"lmsuite: installing with \$py (\$(\$py --version))\"" \
  "if [ ! -d \"$REMOTE_REPO/.git\" ]; then git clone --quiet $url \"$REMOTE_REPO\"; fi" \
  "cd \"$REMOTE_REPO\"" \
  "git remote set-url origin $url" \
  "git fetch --quiet origin $ref" \
  "git checkout --quiet --detach FETCH_HEAD" \
  "if ! \$py -m venv .venv; then $apt install -y \$py-venv" "\$py -m venv .venv" "fi" \
  ".venv/bin/pip install --quiet --upgrade pip" \
  ".venv/bin/pip install --quiet -c constraints.txt -e '.[tpu]'")"
