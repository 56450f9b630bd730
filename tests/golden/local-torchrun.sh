#!/bin/bash
# Rendered by hpc from profile 'local': 2 process(es) on this machine, no scheduler.
# `hpc render --explain` shows where every value came from.
set -eo pipefail
# OMP_NUM_THREADS as `accelerate launch` sets it: the node's CPUs shared among its 2 process(es)
cpus="${SLURM_CPUS_ON_NODE:-$(nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus > 2 ? cpus / 2 : 1 ))}"
export NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo
export HPC_JOB_DIR=/scratch/jobs/local-torchrun
export HPC_RUNTIME_CONFIG="$HPC_JOB_DIR/runtime.json"
export MASTER_ADDR=127.0.0.1
export MASTER_PORT="${MASTER_PORT:-$(( $$ % 4536 + 61000 ))}"
# A requeue, as on a cluster: a rank that checkpointed on the warning signal leaves HPC_REQUEUE_FILE,
# and the processes run again (HPC_RESTART_COUNT counts the rounds) until none asks for it.
mkdir -p "$HPC_JOB_DIR/tasks"
# `hpc launch` runs this from a throw-away folder of its own: it goes when the job does
if [ "${HPC_THROWAWAY_JOB_DIR:-}" = "$HPC_JOB_DIR" ]; then trap 'rm -rf -- "$HPC_JOB_DIR"' EXIT; fi
unset HPC_THROWAWAY_JOB_DIR
export HPC_TASK=0 HPC_STOP_FILE="$HPC_JOB_DIR/tasks/0.stop" HPC_REQUEUE_FILE="$HPC_JOB_DIR/tasks/0.requeue" HPC_RESTART_COUNT="${HPC_RESTART_COUNT:-0}"
# why the job ended without its work done, a line each (`hpc status` shows it)
reason_file="$HPC_JOB_DIR/tasks/0.reason"
rm -f "$reason_file"
# No endless requeues: once a job has committed progress (a checkpoint, a batch job's outputs), it runs again only
# while one of its last 3 attempts advanced it; otherwise it ends FAILED with the reason
# (preemption.max_attempts_without_progress; 0: never). `stalled ATTEMPT` prints that reason when it applies.
stalled() {
  local why
  [ -s "$HPC_JOB_DIR/tasks/$HPC_TASK.progress" ] || return 1
  why=$(/path/to/python -m hpc.runtime.resilience.progress_guard "$HPC_JOB_DIR" "$HPC_TASK" "$1" 3) && return 1
  echo "$why"
}
# Notices (the job's `notify`): one per event and key, sent by hpc.runtime.notify, which never fails the job.
notice() { /path/to/python -m hpc.runtime.notify "$1" "$2" --key "$3" || true; }
# the job's end: its exit code, after a notice of how it ended where the job has `notify`
finish() {
  if [ "$1" -eq 0 ]; then notice completed "the job's work is done" completed
  else notice failed "exit $1: $(tr '\n' ' ' < "$reason_file" 2>/dev/null || true)" failed; fi
  exit "$1"
}
notice started "on $(hostname), 2 process(es)" started
# The scheduler (SLURM, or hpc's local runner) signals this shell (USR1, 120 s before the time
# limit; TERM on cancel or preemption): note it in HPC_STOP_FILE (read by ranks whose launcher does not pass it on) and hand it
# to the job step, whose processes checkpoint and stop.
# Each process starts with USR1 ignored: a program that does not handle it keeps running to the
# limit instead of dying early; hpc's runtime installs its own handler.
step_pid=""
trap 'echo USR1 > "$HPC_STOP_FILE" || true; if [ -n "$step_pid" ]; then kill -USR1 "$step_pid" 2>/dev/null || true; fi' USR1
trap 'echo TERM > "$HPC_STOP_FILE" || true; if [ -n "$step_pid" ]; then kill -TERM "$step_pid" 2>/dev/null || true; fi' TERM
trap 'echo INT > "$HPC_STOP_FILE" || true; if [ -n "$step_pid" ]; then kill -INT "$step_pid" 2>/dev/null || true; fi' INT
while true; do
  rm -f "$HPC_REQUEUE_FILE" "$HPC_STOP_FILE"
  /path/to/python -m hpc.runtime.launch.warm_launch --standalone --nproc_per_node=2 --max_restarts=0 train.py &
step_pid=$!
  # bash runs a trap only between commands: waiting in a loop lets the forwarded signal through
  while kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid" || true; done
  rc=0
  wait "$step_pid" || rc=$?
  [ -e "$HPC_REQUEUE_FILE" ] || finish "$rc"
  if stop_why=$(stalled "$HPC_RESTART_COUNT"); then
    echo "$stop_why; not run again" >> "$reason_file"; echo "hpc: $stop_why: the job ends here" >&2; finish 1
  fi
  HPC_RESTART_COUNT=$((HPC_RESTART_COUNT + 1))
  echo "hpc: requeued: starting the processes again (round $HPC_RESTART_COUNT)" >&2
  notice requeued "starting the processes again (round $HPC_RESTART_COUNT)" "requeued-$HPC_RESTART_COUNT"
done
