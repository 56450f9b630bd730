#!/bin/bash
# Rendered by hpc from profile 'local': 2 process(es) on this machine, no scheduler.
# `hpc render --explain` shows where every value came from.
set -eo pipefail
# OMP_NUM_THREADS as `accelerate launch` sets it: the node's CPUs shared among its 2 process(es)
cpus="${SLURM_CPUS_ON_NODE:-$(nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus > 2 ? cpus / 2 : 1 ))}"
export NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo
export HPC_JOB_DIR=/scratch/jobs/local-resume-args
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
# the job's end: its exit code, after a notice of how it ended where the job has `notify`
finish() {
  exit "$1"
}
export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 NODE_RANK=0
pids=()
stop() { if [ "${#pids[@]}" -gt 0 ]; then kill -"$1" "${pids[@]}" 2>/dev/null || true; fi; }
trap 'echo USR1 > "$HPC_STOP_FILE" || true; stop USR1' USR1
trap 'echo TERM > "$HPC_STOP_FILE" || true; stop TERM' TERM
trap 'echo INT > "$HPC_STOP_FILE" || true; stop INT' INT
while true; do
  rm -f "$HPC_REQUEUE_FILE" "$HPC_STOP_FILE"
  # A script that resumes itself (resume_args): an attempt after a requeue is given the newest checkpoint the script
  # saved (or hpc saved for it at the warning signal) whose manifest verifies; with none, it starts from the beginning.
  resume_args=()
  if checkpoint=$(/path/to/python -m hpc.runtime.checkpoint.script_resume "$HPC_JOB_DIR" "$HPC_TASK"); then
    resume_args=(--resume_from_checkpoint "$checkpoint")
    echo "hpc: resuming the script from $checkpoint" >&2
  fi
  # the ranks are forked by one Python that imported torch once (hpc/runtime/launch/local_ranks.py); it passes
  # signals on, stops the others when one fails and notes which; HPC_RANK_LOGS (set by `hpc submit`): one log
  # file per rank instead of this terminal
  (
    trap "" USR1; exec /path/to/python -m hpc.runtime.launch.local_ranks --nproc 2 --reason-file "$reason_file" ${HPC_RANK_LOGS:+--log "$HPC_RANK_LOGS/rank{rank}-local.out"} train.py "${resume_args[@]}"
  ) &
  pids=($!)
  while kill -0 "${pids[0]}" 2>/dev/null; do wait "${pids[0]}" || true; done
  rc=0
  wait "${pids[0]}" || rc=$?
  pids=()
  [ "$rc" -eq 0 ] && [ -e "$HPC_REQUEUE_FILE" ] || finish "$rc"
  if stop_why=$(stalled "$HPC_RESTART_COUNT"); then
    echo "$stop_why; not run again" >> "$reason_file"; echo "hpc: $stop_why: the job ends here" >&2; finish 1
  fi
  HPC_RESTART_COUNT=$((HPC_RESTART_COUNT + 1))
  echo "hpc: requeued: starting the processes again (round $HPC_RESTART_COUNT)" >&2
done
