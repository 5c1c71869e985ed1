#!/usr/bin/env bash
# Issue 21's GPU check in one device call, every number from one machine: the environment, the gpu-marked
# tests, nanoGPT's bench.py on GPT-2 124M (its own code, batch 12, T=1024, compiled, synthetic data), then
# benchmarks/gpu_mfu.py --all (GPT-2 124M at the largest batch and at nanoGPT's 12, the 1.1B Llama at
# T=2048, the attention sweep to T=16384). Each part has its own time limit, so one failure or hang still
# leaves the others' logs in OUT.
#   benchmarks/gpu_check.sh OUT [NANOGPT_DIR]      # NANOGPT_DIR: a copy of ../shared/peers/nanogpt
# With AUTOTUNE_BATCH=B it then times GPT-2 at micro-batch B under torch.compile's
# max-autotune-no-cudagraphs mode (Triton matmul templates with fused epilogues, coordinate-descent tuning),
# in whatever is left of LIMIT seconds (default 560) counted from the start: --all's row at the same batch
# is its baseline, from the same machine and call.
set -uo pipefail
out="${1:?usage: gpu_check.sh OUT [NANOGPT_DIR]}"
nano="$(cd "${2:-../shared/peers/nanogpt}" && pwd)"
limit="${LIMIT:-560}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.devsite:$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"; } 2>&1 | tee "$out/env.txt"
timeout 120 python3 -m pytest -o addopts= -m gpu tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.txt"
(cd "$nano" && timeout 150 python3 bench.py --device=cuda --compile=True --batch_size=12 --block_size=1024 \
  --real_data=False) 2>&1 | tee "$out/nanogpt_bench.txt"
timeout 330 python3 benchmarks/gpu_mfu.py --all --also-batch 12 2>&1 | tee "$out/gpu_mfu.txt"
date -u | tee -a "$out/env.txt"
if [ -n "${AUTOTUNE_BATCH:-}" ]; then
  left=$((limit - SECONDS - 5))
  if [ "$left" -gt 60 ]; then
    echo "autotune: ${left}s left" | tee "$out/gpu_mfu_autotune.txt"
    timeout "$left" python3 benchmarks/gpu_mfu.py --preset gpt2 --seq 1024 --batch "$AUTOTUNE_BATCH" \
      --compile-mode max-autotune-no-cudagraphs 2>&1 | tee -a "$out/gpu_mfu_autotune.txt"
  else
    echo "autotune: skipped, only ${left}s left" | tee "$out/gpu_mfu_autotune.txt"
  fi
  date -u | tee -a "$out/env.txt"
fi
