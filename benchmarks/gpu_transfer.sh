#!/usr/bin/env bash
# Issue 17's GPU run in device calls (a call may last 10 minutes, and a fresh machine keeps nothing of the last
# one): lm transfer --preset glue_transfer_gpu on the mirror .gpu_data (benchmarks/gpu_transfer_data.sh 5), run as
# lm transfer processes (lanes) that share the GPU, then one that reads them back and writes the table; or, with
# ARMS (below), one arm per call. The run itself goes to /tmp (its checkpoints are far over what a call brings
# back); OUT gets at most six files (a call brings back at most 8): env.txt, log.txt, details.tgz with every
# process' log, each arm's and lane's results.json and the pretraining's metrics; transfer.md and transfer.json
# when the table was written, transfer_<arm>.json when only that arm is whole.
#   benchmarks/gpu_transfer.sh OUT [extra lm transfer arguments for every process, not --finetune/--tasks]
#   ARMS=pretrained TOKENS=150000000 LIMIT=590 FINETUNE="train.log_interval=100" benchmarks/gpu_transfer.sh "$OUT"
# FINETUNE: lm finetune overrides for every process, after (so over) the ones below; none may name a task
# (tasks.<t>.* is refused by a process that does not finetune t). FINETUNE_SST2: more for the SST-2 lanes,
# FINETUNE_OTHER for the cola,mrpc,stsb,rte lanes (both also go to the table's call).
#
# Why four processes: finetuning a 29M model at batch 32 ran at ~37 steps/s on the H200 (2026-11-26), far below
# what the device can do, so lanes were meant to fill it. They do not: processes time-slice the GPU, so the lanes
# cost about what running them in turn would (docs/results.md, "The GPU recipe"). The whole recipe took 12.3
# minutes: two calls on one warm machine, the second the same script resuming every lane (~20 s lost to the stop
# and resume).
# Each arm runs as two lanes, SST-2 (3 seeds) and the other four tasks:
#   1. scratch SST-2 lane (--arm scratch --tasks sst2); it prepares the corpus first, the others wait for that
#   2. scratch lane of cola,mrpc,stsb,rte (its own --out and --scratch), and the pretraining, which then
#      finetunes SST-2 (--arm pretrained --tasks sst2)
#   3. once the pretraining is done: a copy of it in the second lane's --out, and the pretrained lane of the other
#      four tasks
#   4. the second lanes' task directories are copied into the first lanes' arms, and lm transfer (all tasks, both
#      arms) finds every task/seed finished (lm finetune skips a pair with result.pt) and writes the table.
# The finetuning is issue 17's recipe for a GPU (docs/glue_transfer.md, "GPU preset"): every SST-2 and STS-B
# training example, lr 1e-4, bf16 (lm transfer's budget: train.precision=auto; the 2026-11-29 table was finetuned
# in fp32, FINETUNE="train.precision=fp32"); SST-2 in batches of 128 at lr 2e-4 for 2 epochs (its 67k examples were 3/4 of
# the finetuning time at batch 32, and its dev accuracy peaked at epoch 2 of 3 on the H200).
# MRPC and STS-B are read as siamese pairs (the recipe's budget, lm/cli/transfer_recipe.py), STS-B's pooled
# vectors whitened (tasks.stsb.whiten; with these STS-B settings on the CPU recipe's 30M checkpoint: 62.4 -> 68.9,
# and 74.2 with the budget's tasks.stsb.fit_head, docs/results.md);
# RTE is read as siamese pairs too, for 5 epochs: read as one text it stayed at chance in both arms, read apart the
# pretrained arm gains beyond the seed ranges (docs/results.md, "GPU recipe").
# CoLA and STS-B get 4 epochs (2026-11-26, 22:43 on an H100: the pretrained arm's STS-B went 35.7 -> 38.8+,
# CoLA 25.2 -> 26.8, scratch unmoved; average gain +7.8 -> at least +8.9).
# SCRATCH_SST2=0: no scratch SST-2 lane, and SCRATCH_TASKS (default cola,mrpc,stsb,rte) narrows the scratch lane
# of the other tasks: for a rerun that changes only some tasks' recipe, when the device's budget does not hold the
# whole run again (the scratch arm does not depend on the pretraining; lm transfer --scratch shares it the same
# way). The pretraining's lane then prepares the corpus; no table is written (it needs every task in both arms),
# and the lanes' results.json files in details.tgz are put together with the earlier run's scratch results.
# ARMS=pretrained | scratch (default all): one arm per call, for a device budget that does not hold the whole
# recipe in one call (~14 minutes): the pretraining and the pretrained arm (SST-2 lane, then the other four tasks'
# lane once the pretraining is done; 526 s on an H100 on 2026-11-27), or the scratch arm (its two lanes and the
# table; 298 s). Each writes its arm's record, transfer_<arm>.json, into OUT; when the other arm
# finished in an earlier call on the same machine (the same RUN_DIR) the table is written as well. From two
# machines: lm transfer --join OUT1/transfer_pretrained.json OUT2/transfer_scratch.json --out DIR.
# COMPILE (default 1): the pretraining runs under torch.compile (train.compile=true; COMPILE=0: eager, as the
# 2026-11-26 runs). Eager it ran at ~750k tokens/s (~14% MFU) alone on an H100 (2026-11-26): ~200 s for 150M
# tokens. Compiled it was 1.54x eager on this project's 2-core CPU at 8 x 128 (docs/glue_transfer.md);
# on an H100 (2026-11-27) ~936k tokens/s after a ~24 s compile: 199 s for 150M tokens (eager's ~200 s is from
# 2026-11-26, another machine: no same-run comparison was made).
# LIMIT: seconds for the whole script; the lanes get SIGTERM (lm train and lm finetune save their place) 25 s
# before it. The table's (or the arm record's) call then gets up to 60 s, ending 15 s before LIMIT, and is skipped
# with less than 20 s left (the same command on the same machine writes it: every pair is found finished).
# Whatever finished is copied to OUT either way.
set -uo pipefail
out="${1:?usage: gpu_transfer.sh OUT [lm transfer arguments]}"
shift
tokens="${TOKENS:-150000000}"
limit="${LIMIT:-590}"  # a device call lasts at most 600 s
run="${RUN_DIR:-/tmp/gpu_transfer}"
mkdir -p "$out/details"
out="$(cd "$out" && pwd)"
det="$out/details"  # packed into details.tgz at the end
t0=$(date +%s)
export PYTHONUNBUFFERED=1 WANDB_MODE=offline LM_DATA_MIRROR="${LM_DATA_MIRROR:-$PWD/.gpu_data}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the device's Python lacks hydra, omegaconf and zstandard: .devsite holds copies (see docs/glue_transfer.md)
python3 -c "import hydra, omegaconf, zstandard" 2>/dev/null || export PYTHONPATH="$PWD/.devsite:$PYTHONPATH"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"; } 2>&1 | tee "$out/env.txt"

left() {  # seconds the table's or the arm record's call may take: up to 60, ending 15 s before LIMIT
  local s=$((t0 + limit - 15 - $(date +%s)))
  echo $((s > 60 ? 60 : s))
}
say() { echo "[gpu_transfer $(date -u +%T) +$(($(date +%s) - t0))s] $*" | tee -a "$out/log.txt"; }
common=(--preset glue_transfer_gpu --tokens "$tokens" --group gpu_transfer "$@")
[ "${COMPILE:-1}" = 1 ] && common+=(--pretrain train.compile=true)  # after "$@": lm transfer adds both lists
base=(optim.lr=1e-4 train.micro_batch_size=128)
sst2=(tasks.sst2.max_train_examples=null tasks.sst2.batch_size=128 tasks.sst2.lr=2e-4 tasks.sst2.epochs=2)
other=(tasks.stsb.max_train_examples=null tasks.cola.epochs=4 tasks.stsb.epochs=4 tasks.stsb.whiten=true
  tasks.rte.pair_input=siamese tasks.rte.epochs=5)
# shellcheck disable=SC2206  # the FINETUNE* variables are lists of overrides, split on spaces on purpose
extra=(${FINETUNE:-})
sst2+=(${FINETUNE_SST2:-})
other+=(${FINETUNE_OTHER:-})
other_tasks=cola,mrpc,stsb,rte
arms="${ARMS:-all}"
case "$arms" in all | pretrained | scratch) ;; *) echo "gpu_transfer.sh: ARMS=$arms: all, pretrained or scratch" >&2; exit 2 ;; esac
scratch_sst2="${SCRATCH_SST2:-1}"
scratch_tasks="${SCRATCH_TASKS:-$other_tasks}"
b="$run/b"  # the second lanes' --out: their pretraining copy and their scratch arm
pids=()
lane() {  # lane LOG ARGS...: one lm transfer process in the background, its output in OUT/LOG; its pid: $last
  python3 -m lm.cli.transfer "${common[@]}" "${@:2}" > "$det/$1" 2>&1 &
  last=$!
  pids+=("$last")
}
wait_for() {  # wait_for PID LOG PATTERN: until LOG shows PATTERN (0) or PID ends without it (1)
  while ! grep -q "$3" "$det/$2" 2>/dev/null; do
    kill -0 "$1" 2>/dev/null || { grep -q "$3" "$det/$2" 2>/dev/null; return; }
    sleep 2
  done
}
stop_lanes() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; }
# the watchdog polls (no long sleep outlives the script holding its output open)
( while [ "$(date +%s)" -lt $((t0 + limit - 25)) ]; do sleep 1; done
  say "time limit: SIGTERM to the lanes"; kill -TERM "$$" ) > /dev/null 2>&1 &
watchdog=$!
trap 'stop_lanes' TERM

scratch_lane() {  # the scratch arm's lane of the tasks other than SST-2
  local o t keep=()
  for o in "${other[@]}"; do  # a narrowed lane would refuse the overrides of tasks it does not finetune
    t="${o#tasks.}"; t="${t%%.*}"
    [[ "$o" != tasks.* || ",$scratch_tasks," == *",$t,"* ]] && keep+=("$o")
  done
  lane scratch_other.log --out "$b" --scratch "$b/scratch" --arm scratch --tasks "$scratch_tasks" \
    --finetune "${base[@]}" "${keep[@]}" "${extra[@]}"
}
pretrained_lane() {  # the pretraining, then its SST-2 finetuning; its pid: $pre
  # --scratch: only where this lane keeps its recipe record (the arm is the scratch lanes'); apart from theirs, as
  # the scratch arm's whole-arm record (step 5 of an ARMS=scratch call) names every task
  lane pretrained_sst2.log --out "$run" --scratch "$run/record_of_the_pretrained_sst2_lane" --arm pretrained \
    --tasks sst2 --finetune "${base[@]}" "${sst2[@]}" "${extra[@]}"
  pre=$last
}
ready=1  # 0: the pretraining lane started and its arm's second lane may follow
if [ "$arms" = scratch ]; then
  if [ "$scratch_sst2" = 1 ]; then
    say "1. the scratch arm's SST-2 lane (it prepares the corpus); no pretraining (ARMS=scratch)"
    lane scratch_sst2.log --out "$run" --arm scratch --tasks sst2 --finetune "${base[@]}" "${sst2[@]}" "${extra[@]}"
    wait_for "$last" scratch_sst2.log "finetuning from scratch" && { say "2. the scratch arm's $scratch_tasks lane"; scratch_lane; }
  else
    say "1. the scratch arm's $scratch_tasks lane (it prepares the corpus); no pretraining (ARMS=scratch)"
    scratch_lane
  fi
elif [ "$scratch_sst2" = 1 ] && [ "$arms" = all ]; then
  say "1. the scratch arm's SST-2 lane (it prepares the corpus)"
  lane scratch_sst2.log --out "$run" --arm scratch --tasks sst2 --finetune "${base[@]}" "${sst2[@]}" "${extra[@]}"
  if wait_for "$last" scratch_sst2.log "finetuning from scratch"; then
    say "2. the scratch arm's $scratch_tasks lane, and the pretraining (then its SST-2 lane)"
    scratch_lane
    pretrained_lane
    ready=0
  fi
else
  say "1. the pretraining (it prepares the corpus; then its SST-2 lane); no scratch SST-2 lane (ARMS=$arms, SCRATCH_SST2=$scratch_sst2)"
  pretrained_lane
  ready=0
  if [ "$arms" = all ] && wait_for "$pre" pretrained_sst2.log "lm transfer: pretraining"; then
    say "2. the scratch arm's $scratch_tasks lane"
    scratch_lane
  fi
fi
if [ "$ready" = 0 ] && wait_for "$pre" pretrained_sst2.log "finetuning from"; then
  say "3. pretraining done: the pretrained arm's $other_tasks lane, on a copy of it"
  rm -rf "$b/pretrain"; mkdir -p "$b" && cp -r "$run/pretrain" "$b/pretrain"
  # --scratch: the arm whose recipe record (transfer_arm.json, tasks included) this lane checks against its own;
  # a narrowed scratch lane's record names fewer tasks, so this lane then keeps its record apart
  pre_scratch="$b/scratch"
  [ "$scratch_tasks" = "$other_tasks" ] || pre_scratch="$b/scratch_record_of_the_pretrained_lane"
  lane pretrained_other.log --out "$b" --scratch "$pre_scratch" --arm pretrained --tasks "$other_tasks" \
    --finetune "${base[@]}" "${other[@]}" "${extra[@]}"
fi
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
# a TERM that arrived while waiting interrupts `wait`: wait again for the lanes to save their place
for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done
kill "$watchdog" 2>/dev/null
say "lanes finished (any failed or stopped: $failed)"
# Which arms this call finished whole: each of its lanes ended well, and they covered every task
whole=()
if [ "$failed" = 0 ] && [ "$arms" != pretrained ] && [ -f "$det/scratch_sst2.log" ] && [ -f "$det/scratch_other.log" ] \
  && [ "$scratch_tasks" = "$other_tasks" ]; then whole+=(scratch); fi
if [ "$failed" = 0 ] && [ "$arms" != scratch ] && [ -f "$det/pretrained_other.log" ]; then whole+=(pretrained); fi
for arm in "${whole[@]}"; do
  say "4. the $arm arm's second lane's tasks into its first lane's arm"
  for t in ${other_tasks//,/ }; do
    if [ "$arm" = scratch ]; then cp -r "$b/scratch/$t" "$run/finetune/scratch/"
    else cp -r "$b/finetune/pretrained/$t" "$run/finetune/pretrained/"; fi
  done
  touch "$run/arm_$arm.done"  # a later call on this machine (ARMS=the other arm) finds it whole
done
record=""  # the arm whose whole-arm record (transfer_<arm>.json) step 5 wrote
both=$([ -f "$run/arm_scratch.done" ] && [ -f "$run/arm_pretrained.done" ] && echo 1)
if [ "${#whole[@]}" -gt 0 ] && [ "$(left)" -lt 20 ]; then
  say "no time left for the table or the arm's record ($(left) s): the same command on this machine writes it"
elif [ "${#whole[@]}" -gt 0 ] && [ -n "$both" ]; then
  say "5. the table (both arms are whole)"
  rm -f "$run/finetune/scratch/transfer_arm.json"  # the SST-2 lane's record: the table's call writes the whole arm's
  timeout -s TERM "$(left)" python3 -m lm.cli.transfer "${common[@]}" --out "$run" \
    --finetune "${base[@]}" "${sst2[@]}" "${other[@]}" "${extra[@]}" > "$det/table.log" 2>&1
  say "lm transfer (the table) exit status $?"
elif [ "${#whole[@]}" = 1 ]; then
  arm="${whole[0]}"
  say "5. the $arm arm's record (the other arm is not whole on this machine: join the two records later)"
  # its recipe record apart from the lanes' (they name fewer tasks), so a later call's lanes still match theirs
  [ "$arm" = scratch ] && rm -f "$run/finetune/scratch/transfer_arm.json"
  rec=(--scratch "$run/finetune/scratch"); [ "$arm" = pretrained ] && rec=(--scratch "$run/record_of_the_pretrained_arm")
  timeout -s TERM "$(left)" python3 -m lm.cli.transfer "${common[@]}" --out "$run" --arm "$arm" "${rec[@]}" \
    --finetune "${base[@]}" "${sst2[@]}" "${other[@]}" "${extra[@]}" > "$det/${arm}_arm.log" 2>&1
  status=$?
  say "lm transfer --arm $arm exit status $status"
  [ "$status" = 0 ] && record="$arm"
fi
# what a call can bring back: the tables, results and logs, never the checkpoints
cp "$run"/transfer.json "$run"/transfer.md "$out/" 2>/dev/null
[ -n "$record" ] && cp "$run/transfer_$record.json" "$out/" 2>/dev/null  # (the lanes' own records name fewer tasks)
cp "$run"/pretrain/metrics.jsonl "$det/pretrain_metrics.jsonl" 2>/dev/null
for arm in scratch pretrained; do cp "$run/finetune/$arm/results.json" "$det/${arm}_results.json" 2>/dev/null; done
for arm in scratch finetune/pretrained; do  # the second lanes' own results, in case the table's call did not run
  cp "$b/$arm/results.json" "$det/$(basename "$arm")_other_results.json" 2>/dev/null
done
tar czf "$out/details.tgz" -C "$out" details && rm -rf "$det"
say "done"
date -u | tee -a "$out/env.txt"
