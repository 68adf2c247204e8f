#!/usr/bin/env bash
# Clones lmsuite on every host and installs it with JAX's TPU runtime (same pins as setup.cfg).
#   DRY_RUN=1 tpu_scripts/install.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

on_all_hosts "set -e
  test -d lmsuite || git clone --quiet $REPO_URL lmsuite
  cd lmsuite && git fetch --quiet && git checkout --quiet $REPO_REF
  python3.11 -m venv .venv
  .venv/bin/pip install --quiet -e .
  .venv/bin/pip install --quiet 'jax[tpu]==0.10.2' \
    -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
