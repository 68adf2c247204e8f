# Shared settings for the TPU scripts. Override any of them in the environment.
#   DRY_RUN=1 prints every command instead of running it.
TPU_NAME="${TPU_NAME:-lmsuite-pod}"
ZONE="${ZONE:-us-central2-b}"              # v4 zone; v3 pods live in e.g. europe-west4-a
ACCELERATOR="${ACCELERATOR:-v4-32}"        # v3-8 ... v3-2048, v4-8 ... v4-4096
RUNTIME="${RUNTIME:-tpu-ubuntu2204-base}"  # v3 needs e.g. tpu-vm-base
REPO_URL="${REPO_URL:-https://github.com/OWNER/lmsuite.git}"
REPO_REF="${REPO_REF:-main}"

run() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '[dry-run]'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

# Runs one shell command on every host of the pod at once.
on_all_hosts() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"
}
