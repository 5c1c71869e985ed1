#!/usr/bin/env bash
# One node, N processes, with the `deepspeed` launcher (it appends --local_rank, which lm.cli.train
# drops; use any engine, though engine=zero1|zero2|zero3|zero3_offload is what it is for).
#
# Needs: lm installed (deepspeed on PATH). Environment (optional):
#   NPROC_PER_NODE   processes (default: the GPUs visible on this node, else 1)
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
lm_show "$NPROC_PER_NODE process(es) with deepspeed: $LM_ENTRY $*"
exec deepspeed --num_gpus "$NPROC_PER_NODE" --master_port "${MASTER_PORT:-29500}" --module "$LM_ENTRY" "$@"
