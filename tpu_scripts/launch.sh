#!/usr/bin/env bash
# Starts `lmsuite train --distributed` on every worker of the pod at once, detached from ssh;
# or, with --local N, as N processes on this machine (CPU devices, gloo collectives).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
usage: tpu_scripts/launch.sh [--dry-run] [--help] [-- TRAIN_FLAGS...]
       tpu_scripts/launch.sh --local N [--devices-per-process D] [--port P] [--dry-run]
                             [-- TRAIN_FLAGS...]

On a pod, every worker (--worker=all) runs, in ~/lmsuite,
  .venv/bin/lmsuite train --distributed --model_dir=$MODEL_DIR [--tfds_data_dir=$TFDS_DATA_DIR]
                          [--gin_file=F for each F in $GIN_FILE] TRAIN_FLAGS...
under nohup and setsid, so it survives the ssh session. Output is appended to
~/lmsuite-train.log; the exit status is written to ~/lmsuite-train.status when it ends (0 done,
2 configuration error, 3 NaN loss, 143 preempted: run the same command again to resume from the
newest checkpoint in MODEL_DIR). A worker where training still runs refuses a second launch.
MODEL_DIR must be gs://: all workers share it and it outlives the VMs.

TRAIN_FLAGS after -- reach `lmsuite train` unchanged, quoted for the remote shell, so
  -- --gin.RECIPE="'t5_span_corruption'" --gin.MESH_SHAPE='(-1, 4, 1)'
keeps gin's string quotes and the spaces.

--local N runs the same command as N processes here, each with
  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=D
  $LMSUITE train --distributed --coordinator_address=localhost:P --num_processes=N
               --process_id=I --model_dir=$MODEL_DIR ...
LMSUITE defaults to .venv/bin/lmsuite; MODEL_DIR is a local directory here. Each launch is
an attempt, numbered one past the highest in $MODEL_DIR/logs (1, 2, ...): process I logs to
$MODEL_DIR/logs/attempt-K/process_I.log, $MODEL_DIR/logs/latest points to the newest attempt,
and no earlier attempt's log is overwritten. The script waits for all N. When one fails, it
prints `attempt K: process I exited with status S` and the last 20 lines of that process's own
log, leaving out empty lines and the collective library's [Gloo] lines (it says how many); the
others (which would wait forever at their next collective) get SIGTERM, and SIGKILL after
LMSUITE_KILL_GRACE_SECONDS (default 10); the script exits with the failed status (143 when
preempted). SIGINT and SIGTERM sent to the script are passed on to every process.

  --local N                  N processes on this machine instead of the pod
  --devices-per-process D    CPU devices per process (default 1)
  --port P                   the coordinator's port on localhost (default 8476)
  --dry-run                  print the commands ("+ " and the quoted command), run none
                             (or DRY_RUN=1)
  --help                     this text
EOF
}

local_n="" devices=1 port=8476
options="--local --devices-per-process --port --dry-run --help, then -- TRAIN_FLAGS"
need_value() {  # need_value OPTION [NEXT_ARG...]: "--opt V" with V missing is an error
  [[ $# -ge 2 && $2 != --* ]] || die "$1 needs a value"
}
while (($#)); do
  case $1 in
    -h | --help) usage && exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --local=*) local_n="${1#*=}" ;;
    --local) need_value "$@" && local_n="$2" && shift ;;
    --devices-per-process=*) devices="${1#*=}" ;;
    --devices-per-process) need_value "$@" && devices="$2" && shift ;;
    --port=*) port="${1#*=}" ;;
    --port) need_value "$@" && port="$2" && shift ;;
    --) shift && break ;;
    *) unknown_option "$1" "$options" ;;
  esac
  shift
done
load_config

launch_pod() {
  validate_launch "$@"
  # The wrapper records the status even when SIGTERM reaches its whole session: it traps the
  # signal (lmsuite, started after the trap, still gets the default action and its own
  # handler), waits for lmsuite to save and exit, then writes the status. Its pid is written
  # twice: at once by the launching shell ($!, so a second launch right away is refused) and by
  # the wrapper itself ($$, right even where setsid had to fork).
  local wrapper detached
  wrapper="$(join_statements \
    "trap : TERM INT" \
    "echo \$\$ > \"$REMOTE_PID\"" \
    "$(train_command "$@") >> \"$REMOTE_LOG\" 2>&1" \
    "echo \$? > \"$REMOTE_STATUS\"" \
    "rm -f \"$REMOTE_PID\"")"
  detached="nohup setsid bash -c $(quote "$wrapper") > /dev/null 2>&1 < /dev/null"
  ssh_workers all "$(join_statements \
    "set -eu" \
    "cd \"$REMOTE_REPO\"" \
    "if $(remote_training_runs); then echo \"\$(hostname): already training\" >&2" \
    "exit 1" "fi" \
    "rm -f \"$REMOTE_STATUS\"" \
    "echo \"=== launch \$(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> \"$REMOTE_LOG\"" \
    "$detached & echo \$! > \"$REMOTE_PID\"")"
}

# ---------------------------------------------------------------------------- local mode
check_local() {
  [[ $local_n =~ ^[1-9][0-9]*$ ]] || die "--local $local_n: expected a number of processes >= 1"
  [[ $devices =~ ^[1-9][0-9]*$ ]] ||
    die "--devices-per-process $devices: expected a number of CPU devices >= 1"
  if ! [[ $port =~ ^[1-9][0-9]*$ ]] || ((port > 65535)); then
    die "--port $port: expected a TCP port in 1..65535"
  fi
  [[ -n $MODEL_DIR ]] ||
    die "MODEL_DIR is not set: expected a local directory for checkpoints and logs"
  [[ $MODEL_DIR != gs://* ]] ||
    die "MODEL_DIR=$MODEL_DIR: --local writes logs under MODEL_DIR, so expected a local directory"
  [[ -x $LMSUITE ]] || die "LMSUITE=$LMSUITE: expected an executable (the venv's lmsuite)"
  has_gin_file "$@" || die "no gin file: set GIN_FILE or pass --gin_file=... after --"
  [[ ${LMSUITE_KILL_GRACE_SECONDS:=10} =~ ^[0-9]+$ ]] ||
    die "LMSUITE_KILL_GRACE_SECONDS=$LMSUITE_KILL_GRACE_SECONDS: expected whole seconds"
}

local_command() {  # local_command I TRAIN_FLAGS...: sets cmd, process I's command line
  local file files
  cmd=(env JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$devices"
    "$LMSUITE" train --distributed --coordinator_address="localhost:$port"
    --num_processes="$local_n" --process_id="$1" --model_dir="$MODEL_DIR")
  shift
  if [[ -n $TFDS_DATA_DIR ]]; then cmd+=(--tfds_data_dir="$TFDS_DATA_DIR"); fi
  read -ra files <<<"$GIN_FILE"
  for file in "${files[@]}"; do cmd+=(--gin_file="$file"); done
  cmd+=("$@")
}

declare -A live=()  # pid -> process id, for the processes not yet reaped

signal_all() {  # each process leads its own group (setsid): the signal reaches its children too
  local pid
  for pid in "${!live[@]}"; do kill "-$1" -- "-$pid" 2>/dev/null || true; done
}

# Each launch gets its own numbered log directory, one past the highest there is, so a relaunch
# after a failure keeps the failed attempt's logs.
next_attempt() {  # sets attempt: one past the highest K of $MODEL_DIR/logs/attempt-K
  local dir k
  attempt=1
  for dir in "$MODEL_DIR"/logs/attempt-*; do  # the pattern itself when nothing matches
    k="${dir##*/attempt-}"
    if [[ $k =~ ^[1-9][0-9]*$ ]] && ((k >= attempt)); then attempt=$((k + 1)); fi
  done
}

claim_attempt() {  # creates attempt_dir, $MODEL_DIR/logs/attempt-K, and points logs/latest to it
  mkdir -p "$MODEL_DIR/logs"
  next_attempt
  attempt_dir="$MODEL_DIR/logs/attempt-$attempt"
  # mkdir, not mkdir -p: it fails when a launch started at the same moment took this K.
  until mkdir "$attempt_dir" 2>/dev/null; do
    [[ -d $attempt_dir ]] || die "cannot create $attempt_dir"
    attempt=$((attempt + 1))
    attempt_dir="$MODEL_DIR/logs/attempt-$attempt"
  done
  ln -sfn "attempt-$attempt" "$MODEL_DIR/logs/latest"
}

# The failed process's own lines, without the collective library's: every process prints those
# (gloo's connection chatter, a peer's lost connection once one dies), burying the error. Only
# [Gloo] lines go: the coordination service's lines can be the error itself. Empty lines go too:
# gloo's threads write two messages on one line and leave an empty one behind.
report_log_end() {  # report_log_end LOG: its last 20 lines, [Gloo] lines left out
  awk -v me="$SCRIPT_NAME" -v file="$1" -v n=20 '
    /^\[Gloo\]/ { left_out++; next }
    /^[ \t]*$/ { next }
    { kept[++count % n] = $0 }
    END {
      if (count == 0) {  # killed before it wrote a line of its own, or by SIGKILL mid-step
        printf "%s: %s has no lines of its own (%d [Gloo] lines left out)\n", me, file, left_out
        exit
      }
      first = count > n ? count - n + 1 : 1
      printf "%s: the last %d lines of %s (%d [Gloo] lines left out):\n", me, count - first + 1,
        file, left_out
      for (i = first; i <= count; i++) print "  " kept[i % n]
    }' "$1"
}

launch_local() {
  LMSUITE="${LMSUITE:-.venv/bin/lmsuite}"
  check_local "$@"
  local i
  if dry_run; then
    for ((i = 0; i < local_n; i++)); do
      local_command "$i" "$@"
      run "${cmd[@]}"
    done
    next_attempt
    note "attempt $attempt: each under setsid, output to" \
      "$MODEL_DIR/logs/attempt-$attempt/process_I.log"
    return 0
  fi
  claim_attempt
  printf '%s: attempt %s: logs in %s/process_I.log\n' "$SCRIPT_NAME" "$attempt" "$attempt_dir" >&2
  # In their own sessions the processes miss a terminal's Ctrl-C, so it is passed on.
  trap 'signal_all INT' INT
  trap 'signal_all TERM' TERM
  for ((i = 0; i < local_n; i++)); do
    local_command "$i" "$@"
    printf '+ %s\n' "$(quote "${cmd[@]}")" >&2
    setsid "${cmd[@]}" >"$attempt_dir/process_$i.log" 2>&1 &
    live[$!]=$i
  done

  # Polling, not `wait -n`: a trap runs within a poll's 0.2 s, and it needs no bash 5.1.
  local pid status failed="" failed_status=0 deadline=""
  while ((${#live[@]})); do
    for pid in "${!live[@]}"; do
      kill -0 "$pid" 2>/dev/null && continue
      status=0
      wait "$pid" || status=$?
      i="${live[$pid]}"
      unset "live[$pid]"
      if ((status != 0)) && [[ -z $failed ]]; then
        failed=$i failed_status=$status
        # Reported at once, not after the others' grace period: this log is complete now.
        printf '%s: attempt %s: process %s exited with status %s; stopping the others\n' \
          "$SCRIPT_NAME" "$attempt" "$i" "$status" >&2
        report_log_end "$attempt_dir/process_$i.log" >&2
        signal_all TERM
        deadline=$((SECONDS + LMSUITE_KILL_GRACE_SECONDS))
      fi
    done
    if [[ -n $deadline ]] && ((SECONDS >= deadline)); then signal_all KILL; fi
    sleep 0.2
  done
  if [[ -n $failed ]]; then exit "$failed_status"; fi
}

if [[ -n $local_n ]]; then launch_local "$@"; else launch_pod "$@"; fi
