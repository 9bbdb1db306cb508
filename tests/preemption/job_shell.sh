#!/bin/sh
# A shell training loop that asks `tpuctl progress STEP` every step whether to checkpoint (the agreed step after
# a preemption notice), saves and exits when told, and resumes from its checkpoint.
# Run as: tpuctl run ... -- sh job_shell.sh DIR STEPS STEP_S, with $TPUCTL the command that runs tpuctl.
# Files as job_checkpoint.py's: DIR/starts-TASK (start/saved lines), DIR/at-TASK, DIR/ckpt-TASK.
dir=$1 steps=$2 step_s=$3 task=$TPUCTL_TASK_ID
step=$(cat "$dir/ckpt-$task" 2>/dev/null || echo 0)
echo "start $(date +%s.%N) $TPUCTL_GENERATION ${TPUCTL_RESTART_COUNT:-0} $step" >> "$dir/starts-$task"
while [ "$step" -lt "$steps" ]; do
  step=$((step + 1))
  sleep "$step_s"
  echo "$step" > "$dir/at-$task"
  if [ "$($TPUCTL progress "$step")" = "checkpoint $step" ]; then
    echo "$step" > "$dir/ckpt-$task.tmp" && mv "$dir/ckpt-$task.tmp" "$dir/ckpt-$task"
    $TPUCTL progress --checkpointed "$step"
    echo "saved $(date +%s.%N) $TPUCTL_GENERATION $step" >> "$dir/starts-$task"
    exit 0
  fi
done
echo "RESULT {\"task\": $task, \"generation\": $TPUCTL_GENERATION, \"last\": $step}"
