#!/usr/bin/env bash
# Issue 21's GPT-2 MFU levers, A/B in one device call, every row from one machine:
#   aten   F.cross_entropy under torch.compile (the loss before lm.model.loss.cross_entropy's compiled form)
#   ours   lm.model.loss.cross_entropy (log-sum-exp minus an iota-picked target: bf16 logits saved, not fp32
#          log-probs), with a 40-row profile of the last batch
#   cdt    ours + inductor's coordinate-descent tuning of its Triton kernels
#   chunk  ours + model.loss_chunk_size=16384 (the chunked loss, re-measured after its autocast fix)
#   ours256 ours at micro-batch 256 (without the fp32 log-probs it may fit an H200)
#   aten again, to see the run-to-run spread; then the 1.1B Llama at micro-batch 32, ours and aten, if time is left.
# Each part is one process (one model, micro-batches 64 and 128, compiled) with its own time limit; a part
# that would not finish inside LIMIT (default 560) seconds from the start is skipped, so OUT always holds
# what ran. Needs the project's hydra/omegaconf on PYTHONPATH (.devsite, see gpu_devsite.sh).
#   LIMIT=560 benchmarks/gpu_mfu_ab.sh OUT
set -uo pipefail
out="${1:?usage: gpu_mfu_ab.sh OUT}"
limit="${LIMIT:-560}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.devsite:$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"; } 2>&1 | tee "$out/env.txt"

# part NAME SECONDS ARGS...: gpu_mfu.py ARGS with a SECONDS limit, skipped when fewer than SECONDS are left.
part() {
  local name="$1" need="$2"; shift 2
  local left=$((limit - SECONDS))
  if [ "$left" -lt "$need" ]; then
    echo "$name: skipped, ${left}s left of ${limit}" | tee -a "$out/skipped.txt"
    return
  fi
  echo "== $name $(date -u +%T) $*" | tee -a "$out/env.txt"
  timeout "$need" python3 benchmarks/gpu_mfu.py "$@" 2>&1 | tee "$out/$name.txt"
}

gpt2=(--preset gpt2 --seq 1024 --batch 64 --also-batch 128)
part aten 150 "${gpt2[@]}" --ce aten
part ours 150 "${gpt2[@]}" --profile 40
part cdt 170 "${gpt2[@]}" --inductor coordinate_descent_tuning=True
part chunk 110 --preset gpt2 --seq 1024 --batch 64 model.loss_chunk_size=16384
part ours256 130 --preset gpt2 --seq 1024 --batch 256
part aten2 130 "${gpt2[@]}" --ce aten
part llama_ours 150 --preset llama --seq 2048 --batch 32
part llama_aten 150 --preset llama --seq 2048 --batch 32 --ce aten
date -u | tee -a "$out/env.txt"
