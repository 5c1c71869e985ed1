#!/usr/bin/env bash
# Issue 50 item 1 on the GPU recipe's checkpoint, in one device call: pretrain the GLUE GPU preset
# (experiment=glue_transfer_gpu: a pre-norm RoPE encoder, 150M tokens, compiled), lm export it (Hugging Face's
# ESM layout: EsmModel, the encoder without its MLM head), then benchmarks/hf_glue_check.py: Hugging Face's
# EsmForSequenceClassification + Trainer against lm finetune with the matching head ([CLS] through a dense+tanh
# pooler), the same checkpoint, every training row, the GPU recipe's lr 1e-4 and 4 epochs, 3 seeds each.
#   benchmarks/gpu_transfer_data.sh 5 && bash benchmarks/gpu_devsite.sh     # here, once
#   run(carry=[".gpu_data", ".devsite"], command="bash benchmarks/gpu_hf_check.sh $OUT", timeout_s=600)
# A dry run on a CPU, on the corpus the CPU recipe has prepared (PRETRAIN: more lm train overrides, after these):
#   TOKENS=65536 TASKS=rte SEEDS=0 EPOCHS=1 MAX_TRAIN=64 COMPILE=false PRETRAIN="data=gutenberg_mix_bpe \
#     train.micro_batch_size=8" LM_DATA_MIRROR=../shared/data bash benchmarks/gpu_hf_check.sh /tmp/o
# OUT gets env.txt, log.txt, pretrain.log, export.log, check.log (the table after each side) and check.json.
# LIMIT (default 590 s, a device call's 600 less a margin): each step gets what is left; a call stopped in the
# pretraining resumes from its last checkpoint (every 1,000 steps) when run again on the same warm machine.
# The pretraining is the one benchmarks/gpu_transfer.sh runs (its pretrained arm's, 2026-11-27: ~199 s compiled
# on an H100), so the check's STS-B/RTE rows sit beside that run's lm finetune numbers.
set -uo pipefail
out="${1:?usage: gpu_hf_check.sh OUT}"
tokens="${TOKENS:-150000000}"
limit="${LIMIT:-590}"
run="${RUN_DIR:-/tmp/gpu_hf_check}"
mkdir -p "$out" "$run"
out="$(cd "$out" && pwd)"
t0=$(date +%s)
export PYTHONUNBUFFERED=1 WANDB_MODE=offline LM_DATA_MIRROR="${LM_DATA_MIRROR:-$PWD/.gpu_data}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the device's Python lacks hydra, omegaconf and zstandard: .devsite holds copies (benchmarks/gpu_devsite.sh)
python3 -c "import hydra, omegaconf, zstandard" 2>/dev/null || export PYTHONPATH="$PWD/.devsite:$PYTHONPATH"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"; } 2>&1 | tee "$out/env.txt"
say() { echo "[gpu_hf_check $(date -u +%T) +$(($(date +%s) - t0))s] $*" | tee -a "$out/log.txt"; }
left() { echo $((t0 + limit - $(date +%s))); }

steps=$(((tokens + 32767) / 32768))  # the preset's batch: 256 x 128 tokens
say "1. pretraining glue_transfer_gpu for $steps steps ($tokens tokens) in $run/pretrain"
timeout -s TERM "$(left)" python3 -m lm.cli.train experiment=glue_transfer_gpu train.max_steps="$steps" \
  train.compile="${COMPILE:-true}" run_dir="$run/pretrain" logger=none ${PRETRAIN:-} > "$out/pretrain.log" 2>&1
status=$?
say "lm train exit status $status"
[ "$status" = 0 ] || exit "$status"

say "2. lm export (ESM's layout)"
python3 -m lm.cli.export "$run/pretrain" --out "$run/export" --force > "$out/export.log" 2>&1 || exit $?
python3 -c "import json, sys; c = json.load(open(sys.argv[1])); print(c['model_type'], c['architectures'])" \
  "$run/export/hf/config.json" | tee -a "$out/log.txt"

say "3. hf_glue_check: ${TASKS:-stsb,rte}, seeds ${SEEDS:-0,1,2}, lr ${LRS:-1e-4}, ${EPOCHS:-4} epochs ($(left) s left)"
extra=()
[ -n "${MAX_TRAIN:-}" ] && extra+=(--max-train-examples "$MAX_TRAIN")
timeout -s TERM "$(left)" python3 benchmarks/hf_glue_check.py --run "$run/pretrain" --hf-dir "$run/export/hf" \
  --tasks "${TASKS:-stsb,rte}" --seeds "${SEEDS:-0,1,2}" --lrs "${LRS:-1e-4}" --epochs "${EPOCHS:-4}" \
  --sides hf,lm --out "$run/check" --quiet "${extra[@]}" > "$out/check.log" 2>&1
status=$?
cp "$run/check/check.json" "$out/" 2>/dev/null
say "hf_glue_check exit status $status"
exit "$status"
