#!/usr/bin/env bash
# Issue 17's GPU run in one device call (a call may last 10 minutes, and a fresh machine keeps nothing of
# the last one, so the whole recipe must fit in one): lm-transfer --preset glue_transfer_gpu --parallel on the
# mirror .gpu_data (benchmarks/gpu_transfer_data.sh 5), the scratch arm beside the pretraining, then the
# pretrained arm. The run itself goes to /tmp (its checkpoints are far over what a call brings back); OUT
# gets the table, both arms' results.json, the logs and the pretraining's metrics. lm-transfer stops at
# LIMIT seconds (SIGTERM: the parts done so far are still copied).
#   benchmarks/gpu_transfer.sh OUT [extra lm-transfer arguments, not --finetune]
#   TOKENS=150000000 LIMIT=540 FINETUNE="tasks.sst2.epochs=3" benchmarks/gpu_transfer.sh "$OUT"
# FINETUNE: more lm-finetune overrides, after (so over) the ones below; a second --finetune would replace them.
# The finetuning is issue 17's recipe for a GPU (docs/glue_transfer.md, "GPU preset"): every SST-2 and STS-B
# training example, lr 1e-4; SST-2 in batches of 128 at lr 2e-4 for 2 epochs (its 67k examples were 3/4 of
# the finetuning time at batch 32, and its dev accuracy peaked at epoch 2 of 3 on the H200).
set -uo pipefail
out="${1:?usage: gpu_transfer.sh OUT [lm-transfer arguments]}"
shift
tokens="${TOKENS:-150000000}"
limit="${LIMIT:-540}"
run="${RUN_DIR:-/tmp/gpu_transfer}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline LM_DATA_MIRROR="${LM_DATA_MIRROR:-$PWD/.gpu_data}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the device's Python lacks hydra, omegaconf and zstandard: .devsite holds copies (see docs/glue_transfer.md)
python3 -c "import hydra, omegaconf, zstandard" 2>/dev/null || export PYTHONPATH="$PWD/.devsite:$PYTHONPATH"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"; } 2>&1 | tee "$out/env.txt"
timeout -s TERM -k 30 "$limit" python3 -m lm.cli.transfer --preset glue_transfer_gpu --tokens "$tokens" --parallel \
  --out "$run" --finetune optim.lr=1e-4 train.micro_batch_size=128 \
    tasks.sst2.max_train_examples=null tasks.stsb.max_train_examples=null \
    tasks.sst2.batch_size=128 tasks.sst2.lr=2e-4 tasks.sst2.epochs=2 ${FINETUNE:-} "$@" 2>&1 | tee "$out/log.txt"
echo "lm-transfer exit status ${PIPESTATUS[0]}" | tee -a "$out/log.txt"
# what a call can bring back: the tables, results and logs, never the checkpoints
cp "$run"/transfer.json "$run"/transfer.md "$run"/transfer_seconds.json "$out/" 2>/dev/null
cp "$run"/pretrain/metrics.jsonl "$out/pretrain_metrics.jsonl" 2>/dev/null
for arm in scratch pretrained; do
  cp "$run/finetune/$arm/results.json" "$out/${arm}_results.json" 2>/dev/null
  cp "$run/finetune/$arm/lane.log" "$out/${arm}_lane.log" 2>/dev/null
done
date -u | tee -a "$out/env.txt"
