#!/usr/bin/env bash
# One node, N processes, with torchrun (DDP, FSDP2 and DeepSpeed engines alike). --standalone
# picks a free local port for the rendezvous, so two jobs can share a node.
#
# Needs: lm installed (torchrun on PATH). Environment (optional):
#   NPROC_PER_NODE   processes to start (default: the GPUs visible on this node, else 1)
#   LM_ENTRY, NCCL_*, OMP_NUM_THREADS: see launch/common.sh
#
# Example (8 GPUs, ZeRO-2; the Hydra overrides after the script name are passed unchanged):
#   launch/torchrun.sh engine=zero2 model=gpt2 data=openwebtext_bpe run_dir=runs/gpt2-z2
#   NPROC_PER_NODE=2 OMP_NUM_THREADS=1 launch/torchrun.sh engine=ddp run_dir=runs/cpu-ddp   # CPU, gloo
set -euo pipefail
# shellcheck source=launch/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

lm_default_nproc
lm_need_command torchrun
lm_show "$NPROC_PER_NODE process(es) with torchrun: $LM_ENTRY $*"
exec torchrun --standalone --nproc_per_node "$NPROC_PER_NODE" -m "$LM_ENTRY" "$@"
