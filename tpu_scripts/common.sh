# shellcheck shell=bash source-path=SCRIPTDIR
# Shared by the pod scripts: configuration, validation, and the one place that runs or prints
# commands. Sourced, never executed. Every check here runs before the first command, so a
# mistake costs a message, not a half-created pod.

TPU_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT_NAME="$(basename "$0")"

# Files on every worker. Fixed names, so status.sh and recover.sh can find what launch.sh wrote.
# \$HOME is expanded there, not here.
# shellcheck disable=SC2034  # read by the scripts that source this file, not by this file
readonly REMOTE_REPO="\$HOME/lmsuite" REMOTE_LOG="\$HOME/lmsuite-train.log" \
  REMOTE_STATUS="\$HOME/lmsuite-train.status" REMOTE_PID="\$HOME/lmsuite-train.pid"
OWNER_PLACEHOLDER='https://github.com/OWNER/lmsuite.git'

# Everything pod.env may set; the environment wins over the file for each of them.
POD_VARS=(TPU_NAME PROJECT ZONE ACCELERATOR RUNTIME PROVISIONING QUEUED QR_ID REPO_URL REPO_REF
  MODEL_DIR TFDS_DATA_DIR GIN_FILE POLL_SECONDS QUEUE_TIMEOUT_SECONDS)

die() {
  printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
  exit 2
}

note() { printf '# %s\n' "$*"; }

unknown_option() {
  die "unknown option '$1'; valid options: $2 (see --help)"
}

# Quotes each argument as Python's shlex.quote does, not as printf %q: the dry-run lines then
# paste into any POSIX shell and parse back with shlex.split, and a command sent over ssh reads
# the same whatever the remote login shell is.
quote() {
  local arg out=() escaped="'\\''"
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+=("$arg")
    else
      out+=("'${arg//\'/$escaped}'")
    fi
  done
  local IFS=' '
  printf '%s' "${out[*]}"
}

dry_run() { [[ $DRY_RUN == 1 ]]; }

# The options of the scripts that take only --dry-run and --help (each defines usage()).
parse_plain_options() {
  while (($#)); do
    case $1 in
      -h | --help) usage && exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      *) unknown_option "$1" "--dry-run --help" ;;
    esac
    shift
  done
}

# The stable "+ " prefix is what the tests read; in a real run the same line goes to stderr,
# so it never mixes with output a caller captures.
run() {
  if dry_run; then
    printf '+ %s\n' "$(quote "$@")"
  else
    printf '+ %s\n' "$(quote "$@")" >&2
    "$@"
  fi
}

gcloud_run() { run gcloud "$@" ${PROJECT:+"--project=$PROJECT"}; }

# ssh_workers WORKER COMMAND: WORKER is all, or one index.
ssh_workers() {
  gcloud_run compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker="$1" --command="$2"
}

# Prints NAME=VALUE lines for the POD_VARS the config file sets. The file is sourced in the
# subshell this runs in, so it cannot touch anything else (DRY_RUN, say); a variable it sets
# that no script reads is a typo, and an error.
config_assignments() {
  local before="" name="" unknown=()
  before=" $(compgen -v | tr '\n' ' ') "
  # shellcheck source=pod.env.example
  source "$1" >/dev/null || die "$1 failed (it is sourced as bash)"
  while read -r name; do
    [[ $before == *" $name "* || " ${POD_VARS[*]} " == *" $name "* ]] || unknown+=("$name")
  done < <(compgen -v)
  ((${#unknown[@]} == 0)) ||
    die "$1 sets ${unknown[*]}, which no pod script reads; it may set: ${POD_VARS[*]}"
  for name in "${POD_VARS[@]}"; do
    if [[ -n ${!name+set} ]]; then printf '%s=%q\n' "$name" "${!name}"; fi
  done
}

load_config() {
  local config="${POD_CONFIG:-$TPU_SCRIPTS_DIR/pod.env}" name assignments
  local -A from_env=()
  if [[ -n ${POD_CONFIG:-} && ! -f $POD_CONFIG ]]; then
    die "POD_CONFIG=$POD_CONFIG does not exist (unset it to use $TPU_SCRIPTS_DIR/pod.env)"
  fi
  for name in "${POD_VARS[@]}"; do
    if [[ -n ${!name+set} ]]; then from_env[$name]="${!name}"; fi
  done
  if [[ -f $config ]]; then
    assignments="$(config_assignments "$config")" || exit 2
    eval "$assignments"  # printf %q quoted every value
  fi
  for name in "${!from_env[@]}"; do printf -v "$name" '%s' "${from_env[$name]}"; done

  TPU_NAME="${TPU_NAME:-lmsuite-pod}"
  PROJECT="${PROJECT:-}"
  ZONE="${ZONE:-}"
  ACCELERATOR="${ACCELERATOR:-}"
  RUNTIME="${RUNTIME:-}"
  PROVISIONING="${PROVISIONING:-on-demand}"
  QUEUED="${QUEUED:-0}"
  QR_ID="${QR_ID:-$TPU_NAME-qr}"
  REPO_URL="${REPO_URL:-}"
  REPO_REF="${REPO_REF:-main}"
  MODEL_DIR="${MODEL_DIR:-}"
  TFDS_DATA_DIR="${TFDS_DATA_DIR:-}"
  GIN_FILE="${GIN_FILE:-}"
  POLL_SECONDS="${POLL_SECONDS:-60}"
  QUEUE_TIMEOUT_SECONDS="${QUEUE_TIMEOUT_SECONDS:-3600}"
  DRY_RUN="${DRY_RUN:-0}"
  export DRY_RUN  # recover.sh runs the other scripts; they must print, not act, too

  [[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || die "DRY_RUN=$DRY_RUN: expected 0 or 1"
  if [[ -n ${LMSUITE_FAKE_STATE:-} ]] && ! dry_run; then
    die "LMSUITE_FAKE_STATE=$LMSUITE_FAKE_STATE is honoured only with --dry-run (DRY_RUN=1)"
  fi
}

# ---------------------------------------------------------------------------------- checks
require_uint() {  # require_uint NAME: a non-negative integer
  [[ ${!1} =~ ^[0-9]+$ ]] || die "$1=${!1}: expected a non-negative whole number of seconds"
}

check_node() {
  [[ $TPU_NAME =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
    die "TPU_NAME=$TPU_NAME: expected lowercase letters, digits and hyphens, starting with a letter"
  [[ -n $ZONE ]] || die "ZONE is not set: expected a Cloud TPU zone such as us-central2-b"
  [[ $QUEUED == 0 || $QUEUED == 1 ]] ||
    die "QUEUED=$QUEUED: expected 0 (a TPU VM) or 1 (a queued resource)"
  if [[ $QUEUED == 1 ]]; then
    [[ $QR_ID =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
      die "QR_ID=$QR_ID: expected lowercase letters, digits and hyphens, starting with a letter"
  fi
}

is_pow2() { (($1 > 0 && ($1 & ($1 - 1)) == 0)); }

# Sets TPU_GENERATION and DEFAULT_RUNTIME from ACCELERATOR. Runtimes are the ones Google's "TPU
# software versions" page names for JAX: the base images, onto which setup.sh installs jax[tpu].
check_accelerator() {
  local known="v3-N (N = 8, 16, ..., 2048), v4-N (N = 8, 16, ..., 4096), \
v5litepod-N (N = 1, 4, 8, ..., 256) or v5p-N (N a multiple of 8 up to 12288)"
  [[ -n $ACCELERATOR ]] || die "ACCELERATOR is not set: expected $known"
  local n="${ACCELERATOR##*-}" ok
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "unknown ACCELERATOR '$ACCELERATOR': expected $known"
  case ${ACCELERATOR%-*} in
    v3) TPU_GENERATION=v3 DEFAULT_RUNTIME=tpu-ubuntu2204-base ok=$((n >= 8 && n <= 2048)) ;;
    v4) TPU_GENERATION=v4 DEFAULT_RUNTIME=tpu-ubuntu2204-base ok=$((n >= 8 && n <= 4096)) ;;
    v5litepod) TPU_GENERATION=v5e DEFAULT_RUNTIME=v2-alpha-tpuv5-lite ok=$((n != 2 && n <= 256)) ;;
    # v5p slices come in many shapes, not only powers of two; gcloud rejects the ones that
    # do not exist, so this only catches the impossible ones.
    v5p) TPU_GENERATION=v5p DEFAULT_RUNTIME=v2-alpha-tpuv5 ok=$((n % 8 == 0 && n <= 12288)) ;;
    *) die "unknown ACCELERATOR '$ACCELERATOR': expected $known" ;;
  esac
  if [[ $TPU_GENERATION != v5p ]] && ! is_pow2 "$n"; then ok=0; fi
  ((ok)) || die "unknown ACCELERATOR '$ACCELERATOR': expected $known"
  RUNTIME="${RUNTIME:-$DEFAULT_RUNTIME}"
}

# From Google's "TPU regions and zones" page. A zone missing here fails before anything is
# created; LMSUITE_SKIP_ZONE_CHECK=1 trusts the zone instead when this table is out of date.
zones_offering() {
  case $TPU_GENERATION in
    v3) if [[ $ACCELERATOR == v3-8 ]]; then
      echo europe-west4-a us-central1-a us-central1-b
    else
      echo europe-west4-a  # v3 pod slices (v3-32 and up) exist only there
    fi ;;
    v4) echo us-central2-b ;;
    v5e) echo us-central1-a us-east5-a us-east5-b us-east5-c us-south1-a us-west1-c us-west4-a \
      europe-west4-b ;;
    v5p) echo us-central1-a us-east5-a us-east5-b us-east5-c us-south1-a europe-west4-b ;;
  esac
}

check_zone() {
  [[ ${LMSUITE_SKIP_ZONE_CHECK:-0} == 1 ]] && return 0
  local zones
  zones="$(zones_offering)"
  [[ " $zones " == *" $ZONE "* ]] ||
    die "ZONE=$ZONE does not offer ACCELERATOR=$ACCELERATOR ($TPU_GENERATION); zones that do:" \
      "$zones (LMSUITE_SKIP_ZONE_CHECK=1 skips this table if it is out of date)"
}

check_provisioning() {
  [[ $PROVISIONING == on-demand || $PROVISIONING == spot || $PROVISIONING == reserved ]] ||
    die "PROVISIONING=$PROVISIONING: expected on-demand, spot or reserved"
}

validate_create() {
  check_node
  check_accelerator
  check_zone
  check_provisioning
  require_uint POLL_SECONDS
  require_uint QUEUE_TIMEOUT_SECONDS
}

validate_setup() {
  check_node
  if [[ -z $REPO_URL || $REPO_URL == "$OWNER_PLACEHOLDER" ]]; then
    die "REPO_URL=${REPO_URL:-<unset>}: expected the git URL every worker clones lmsuite from" \
      "(your fork or mirror, reachable from the TPU VMs)"
  fi
  [[ -n $REPO_REF ]] || die "REPO_REF is empty: expected a branch, tag or commit"
}

# has_gin_file ARGS...: whether a gin file is configured or among the training flags.
has_gin_file() {
  local arg
  [[ -n $GIN_FILE ]] && return 0
  for arg in "$@"; do [[ $arg == --gin_file || $arg == --gin_file=* ]] && return 0; done
  return 1
}

validate_launch() {  # validate_launch TRAIN_ARGS...
  check_node
  # Every worker writes the same checkpoints, and recovery deletes the VMs with their disks:
  # only a bucket is shared by all workers and outlives them.
  [[ $MODEL_DIR == gs://?* ]] ||
    die "MODEL_DIR=${MODEL_DIR:-<unset>}: expected a gs:// path shared by all workers"
  has_gin_file "$@" || die "no gin file: set GIN_FILE or pass --gin_file=... after --"
}

# ------------------------------------------------------------------------ what workers run
# train_command ARGS...: the training command, quoted, as every worker runs it.
train_command() {
  local cmd=(.venv/bin/lmsuite train --distributed --model_dir="$MODEL_DIR") file files
  if [[ -n $TFDS_DATA_DIR ]]; then cmd+=(--tfds_data_dir="$TFDS_DATA_DIR"); fi
  read -ra files <<<"$GIN_FILE"
  for file in "${files[@]}"; do cmd+=(--gin_file="$file"); done
  quote "${cmd[@]}" "$@"
}

# Each remote script is one line (statements joined by "; "), so a dry run prints one line
# per command.
join_statements() {
  local IFS=$'\x1f'
  local joined="$*"
  printf '%s' "${joined//$'\x1f'/; }"
}

# A test for the remote shell: true while launch.sh's training runs on that worker. A status
# file means it has ended, even while the wrapper that wrote it is still removing its pid file.
remote_training_runs() {
  printf '%s' "[ ! -f \"$REMOTE_STATUS\" ] && [ -f \"$REMOTE_PID\" ] && \
kill -0 \"\$(cat \"$REMOTE_PID\")\" 2>/dev/null"
}

# One line per worker, parsed by recover.sh: "HOST training=STATE exit_status=CODE".
remote_status_script() {
  join_statements \
    "if $(remote_training_runs); then t=running" \
    "elif [ -f \"$REMOTE_STATUS\" ]; then t=exited; else t=not-started; fi" \
    "s=\$(cat \"$REMOTE_STATUS\" 2>/dev/null || echo none)" \
    "echo \"\$(hostname) training=\$t exit_status=\$s\""
}

# ---------------------------------------------------------------------------- node states
# Sets STATE: the queued resource's state with QUEUED=1, else the node's. A dry run takes it
# from LMSUITE_FAKE_STATE, so the recovery path can be printed without gcloud.
read_state() {
  local cmd
  if [[ $QUEUED == 1 ]]; then
    cmd=(compute tpus queued-resources describe "$QR_ID" --zone="$ZONE"
      '--format=value(state.state)')
  else
    cmd=(compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" '--format=value(state)')
  fi
  if dry_run; then
    gcloud_run "${cmd[@]}"
    STATE="${LMSUITE_FAKE_STATE:-}"
  else
    STATE="$(gcloud_run "${cmd[@]}")"
    [[ -n $STATE ]] || die "gcloud printed no state for the $(resource_label)"
  fi
}

# A preempted node cannot be restarted, only deleted and created again; a queued resource
# whose node was taken back (SUSPENDED) or that could not be filled (FAILED) is not retried by
# Cloud TPU either.
state_is_lost() {
  if [[ $QUEUED == 1 ]]; then
    [[ $1 == FAILED || $1 == SUSPENDED ]]
  else
    [[ $1 == PREEMPTED || $1 == TERMINATED ]]
  fi
}

# What read_state describes, for messages.
resource_label() {
  if [[ $QUEUED == 1 ]]; then echo "queued resource $QR_ID"; else echo "node $TPU_NAME"; fi
}

state_is_ready() {
  if [[ $QUEUED == 1 ]]; then [[ $1 == ACTIVE ]]; else [[ $1 == READY ]]; fi
}
