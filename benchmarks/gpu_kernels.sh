#!/usr/bin/env bash
# Issue 53's GPU run in one device call (at most LIMIT seconds, default 530: a call lasts <= 9 minutes), every
# number from one machine, raw output in OUT:
#   tests     the gpu-marked tests of the fused kernels and float8 against the eager ops (tests/test_kernels_gpu.py)
#   nanogpt   nanoGPT's bench.py on GPT-2 124M (its own code: batch 12, T=1024, compiled, synthetic data)
#   gpt2      GPT-2 124M, T=1024, compiled: each model.kernels switch at micro-batch 64 (tokens/s, MFU, HFU, peak
#             memory), the eager ops and all of Liger's also at nanoGPT's batch 12 (against nanogpt's row)
#   llama     the 1.1B Llama, T=2048, micro-batch 8, compiled: bf16 and train.float8=torchao (tokens/s)
#   glue      the glue_transfer_gpu preset's encoder (T=128, micro-batch 256, bf16): tokens/s per lever (eager,
#             compiled, each kernel, micro-batch 512, max-autotune, CUDA graphs)
#   llama300  the Llama at micro-batch 4: bf16 and float8 from seed 0, the loss after 300 steps of one fixed batch
#             (a proxy only: same seed, same data, how far float8's training drifts from bf16's)
# Parts run in that order; each row of benchmarks/gpu_mfu.py is one JSON line, all gathered in OUT/rows.jsonl.
# A part (or a config of one) starts only with enough of LIMIT left and has its own time limit, so a failure or a
# hang still leaves the others' logs; what was skipped says so in OUT/skipped.txt. PARTS narrows the list (a
# second call for what the first had no time for: PARTS="llama glue llama300").
#   here:       bash benchmarks/gpu_devsite.sh && bash benchmarks/gpu_kernels_site.sh    (.devsite, .kernelsite)
#   device:     bash benchmarks/gpu_kernels.sh OUT [NANOGPT_DIR]     run(carry=[".devsite", ".kernelsite"])
#   on a CPU:   bash benchmarks/gpu_kernels.sh --dry-run OUT         every part's commands at tiny shapes on the CPU:
#               they compose and start; a kernel or float8 config ends in its one-line CUDA refusal, which counts
# NANOGPT_DIR: a copy of ../shared/peers/nanogpt (the default).
set -uo pipefail
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out="${1:?usage: gpu_kernels.sh [--dry-run] OUT [NANOGPT_DIR]}"
nano="$(cd "${2:-../shared/peers/nanogpt}" 2>/dev/null && pwd || echo "${2:-../shared/peers/nanogpt}")"
limit="${LIMIT:-530}"
[ "$dry" = 1 ] && limit=100000  # a dry run checks every command: no part is skipped for time
parts="${PARTS:-tests nanogpt gpt2 llama glue llama300}"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)" || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.devsite:$PWD/.kernelsite:$PWD${PYTHONPATH:+:$PYTHONPATH}"
: > "$out/skipped.txt"

left() { echo $((limit - SECONDS)); }

# mfu PART NEED TIMEOUT ARGS...: one benchmarks/gpu_mfu.py process, if NEED seconds are left; its rows to rows.jsonl.
mfu() {
  local part="$1" need="$2" cap="$3"
  shift 3
  local args=("$@")
  if [ "$dry" = 1 ]; then
    args=()
    local overrides=() skip=0 value=0
    for a in "$@"; do  # tiny shapes on the CPU: drop what only a GPU run means; overrides last (argparse)
      if [ "$skip" = 1 ]; then skip=0; continue; fi
      if [ "$value" = 1 ]; then value=0; args+=("$a"); continue; fi
      case "$a" in
        --also-batch|--compile-mode|--steps|--batch|--seq) skip=1 ;;
        --preset) args+=("$a"); value=1 ;;
        --*) args+=("$a") ;;
        *) overrides+=("$a") ;;
      esac
    done
    args+=(--device cpu --no-compile --seq 16 --batch 2 --steps 1 model.n_layers=1 model.dim=64 model.n_heads=2
           model.n_kv_heads=1 "${overrides[@]}")
    need=0
  fi
  if [ "$(left)" -lt "$need" ]; then
    echo "$part: skipped (${need}s needed, $(left)s left): ${args[*]}" | tee -a "$out/skipped.txt"
    return
  fi
  local t=$(( $(left) - 5 < cap ? $(left) - 5 : cap ))
  [ "$dry" = 1 ] && t="$cap"
  echo "== $part: gpu_mfu.py ${args[*]} (limit ${t}s)" >> "$out/$part.txt"
  timeout "$t" python3 benchmarks/gpu_mfu.py "${args[@]}" > "$out/.last" 2>&1
  local rc=$?
  cat "$out/.last" >> "$out/$part.txt"
  grep '^{' "$out/.last" >> "$out/rows.jsonl"
  if [ "$dry" = 1 ]; then
    if [ "$rc" = 0 ] && grep -q '^{' "$out/.last"; then echo "dry-run ok: $part ${args[*]}"
    elif tail -1 "$out/.last" | grep -q "CUDA device\|lm\[kernels\]"; then
      echo "dry-run ok (refused on the CPU, as it must be): $part ${args[*]}"
    else echo "DRY-RUN FAILED: $part ${args[*]}"; tail -5 "$out/.last"; failed=1; fi
  fi
  rm -f "$out/.last"
}

failed=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
  python3 -c "import importlib.metadata as m; print(*(f'{p} {m.version(p)}' for p in ('liger_kernel', 'cut_cross_entropy', 'torchao', 'triton')))" 2>&1 | tail -1
} > "$out/env.txt" 2>&1

GPT2=(--preset gpt2 --seq 1024 --steps 10)
LLAMA=(--preset llama --seq 2048 --steps 10)
GLUE=(--preset experiment=glue_transfer_gpu --seq 128 --steps 20)
LIGER_ALL=(model.kernels.cross_entropy=liger model.kernels.norm=liger)

for part in $parts; do
  case "$part" in
    tests)
      if [ "$(left)" -lt 60 ] && [ "$dry" = 0 ]; then echo "tests: skipped" >> "$out/skipped.txt"; continue; fi
      timeout 150 python3 -m pytest -o addopts= -m gpu tests/test_kernels_gpu.py -q -p no:cacheprovider > "$out/tests.txt" 2>&1
      [ "$dry" = 1 ] && { grep -q " skipped\| passed" "$out/tests.txt" && echo "dry-run ok: tests ($(tail -1 "$out/tests.txt"))" \
        || { echo "DRY-RUN FAILED: tests"; tail -5 "$out/tests.txt"; failed=1; }; }
      ;;
    nanogpt)
      if [ "$dry" = 1 ]; then
        python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$nano/bench.py" \
          && echo "dry-run ok: nanogpt ($nano/bench.py parses)" || { echo "DRY-RUN FAILED: nanogpt: $nano/bench.py"; failed=1; }
        continue
      fi
      if [ "$(left)" -lt 60 ]; then echo "nanogpt: skipped ($(left)s left)" >> "$out/skipped.txt"; continue; fi
      (cd "$nano" && timeout 120 python3 bench.py --device=cuda --compile=True --batch_size=12 --block_size=1024 \
        --real_data=False) > "$out/nanogpt.txt" 2>&1
      ;;
    gpt2)
      mfu gpt2 70 150 "${GPT2[@]}" --batch 64 --also-batch 12
      mfu gpt2 70 150 "${GPT2[@]}" --batch 64 --also-batch 12 "${LIGER_ALL[@]}"
      mfu gpt2 50 120 "${GPT2[@]}" --batch 64 model.kernels.cross_entropy=liger
      mfu gpt2 50 120 "${GPT2[@]}" --batch 64 model.kernels.cross_entropy=cce
      mfu gpt2 50 120 "${GPT2[@]}" --batch 64 model.kernels.norm=liger
      ;;
    llama)
      mfu llama 90 180 "${LLAMA[@]}" --batch 8
      mfu llama 90 180 "${LLAMA[@]}" --batch 8 --float8
      ;;
    glue)
      mfu glue 30 90 "${GLUE[@]}" --batch 256 --no-compile
      mfu glue 40 90 "${GLUE[@]}" --batch 256
      mfu glue 40 90 "${GLUE[@]}" --batch 256 model.kernels.cross_entropy=liger
      mfu glue 40 90 "${GLUE[@]}" --batch 256 model.kernels.norm=liger
      mfu glue 40 90 "${GLUE[@]}" --batch 256 "${LIGER_ALL[@]}"
      mfu glue 40 90 "${GLUE[@]}" --batch 512 "${LIGER_ALL[@]}"
      mfu glue 40 90 "${GLUE[@]}" --batch 256 --compile-mode reduce-overhead "${LIGER_ALL[@]}"
      mfu glue 90 150 "${GLUE[@]}" --batch 256 --compile-mode max-autotune-no-cudagraphs "${LIGER_ALL[@]}"
      ;;
    llama300)
      mfu llama300 150 200 --preset llama --seq 2048 --batch 4 --steps 300
      mfu llama300 150 200 --preset llama --seq 2048 --batch 4 --steps 300 --float8
      ;;
    *) echo "unknown part $part (parts: tests nanogpt gpt2 llama glue llama300)"; failed=1 ;;
  esac
done
date -u >> "$out/env.txt"
[ "$dry" = 1 ] && { [ "$failed" = 0 ] && echo "dry-run: every part starts" || echo "dry-run: FAILED"; }
exit "$failed"
