#!/usr/bin/env bash
# One node, N processes, with the `deepspeed` launcher (it appends --local_rank, which lm.cli.train
# drops; use any engine, though engine=zero1|zero2|zero3|zero3_offload is what it is for).
#
# Needs: lm installed (deepspeed on PATH). Environment (optional):
#   NPROC_PER_NODE   processes (default: the GPUs visible on this node, else 1); with CUDA_VISIBLE_DEVICES
#                    set, the first NPROC_PER_NODE of its GPUs (--include, not --num_gpus)
#   MASTER_PORT      a free local port (default 29500)
#   LM_ENTRY, NCCL_*, TORCH_EXTENSIONS_DIR: see launch/common.sh
#
# Example:
#   launch/deepspeed.sh engine=zero3 model=llama data=tinystories_bpe run_dir=runs/llama-z3
set -euo pipefail
# shellcheck source=launch/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

lm_default_nproc
lm_need_command deepspeed
# With --num_gpus the launcher drops CUDA_VISIBLE_DEVICES and takes GPUs 0..N-1 (another job's, on a shared node):
# the GPUs this job may use are named with --include instead.
gpus=(--num_gpus "$NPROC_PER_NODE")
if [[ "${CUDA_VISIBLE_DEVICES:-}" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  [ "$NPROC_PER_NODE" -le "${#visible[@]}" ] ||
    lm_die "NPROC_PER_NODE=$NPROC_PER_NODE is more than the ${#visible[@]} GPU(s) of CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  gpus=(--include "localhost:$(IFS=,; echo "${visible[*]:0:$NPROC_PER_NODE}")")
fi
lm_show "$NPROC_PER_NODE process(es) with deepspeed: $LM_ENTRY $*"
exec deepspeed "${gpus[@]}" --master_port "${MASTER_PORT:-29500}" --module "$LM_ENTRY" "$@"
