#!/usr/bin/env bash
# `accelerate launch` on one node or many, with the config files in launch/accelerate/.
# lm's engine (engine=ddp|zero1..3|fsdp2) does the parallelism; accelerate only starts the
# processes (through torchrun), so its config says how many and where, nothing else.
#
# Needs: lm installed (accelerate on PATH). Environment (optional):
#   NPROC_PER_NODE   processes per node (default: the GPUs visible on this node, else 1)
#   NNODES           nodes (default 1); with NNODES > 1 also NODE_RANK and MASTER_ADDR (as for
#                    launch/torchrun_multinode.sh) and MASTER_PORT (default 29500)
#   ACCELERATE_CONFIG  a config file (default launch/accelerate/multi_gpu.yaml, or multi_node.yaml
#                    when NNODES > 1); the counts above override the file's
#   LM_ENTRY, NCCL_*: see launch/common.sh
#
# Examples:
#   launch/accelerate.sh engine=ddp run_dir=runs/acc-ddp
#   node0$ NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/accelerate.sh engine=zero3 run_dir=/shared/runs/z3
#   node1$ NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 launch/accelerate.sh engine=zero3 run_dir=/shared/runs/z3
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=launch/common.sh
. "$here/common.sh"

lm_default_nproc
lm_need_command accelerate
NNODES="${NNODES:-1}"
lm_need_count NNODES
nnodes="$NNODES"
total=$((NPROC_PER_NODE * nnodes))
if [ "$nnodes" -gt 1 ]; then
  config="${ACCELERATE_CONFIG:-$here/accelerate/multi_node.yaml}"
  lm_need NODE_RANK "this node's index from 0 to NNODES-1, e.g. NODE_RANK=0 on the first node"
  lm_need_node_rank
  lm_need MASTER_ADDR "an address of node 0 that every node can reach, e.g. MASTER_ADDR=node001"
  machine=(--machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "${MASTER_PORT:-29500}")
else
  config="${ACCELERATE_CONFIG:-$here/accelerate/multi_gpu.yaml}"
  machine=(--main_process_port "${MASTER_PORT:-29500}")
fi
[ -f "$config" ] || lm_die "ACCELERATE_CONFIG=$config does not exist (see launch/accelerate/)"
# Without --multi_gpu, `accelerate launch --num_processes N` on a CPU host starts ONE process
# (seen on this project's CPU hosts); with it accelerate runs torchrun, which lm drives on gloo or NCCL.
multi=()
if [ "$total" -gt 1 ]; then multi=(--multi_gpu); fi
lm_show "$total process(es) on $nnodes node(s) with accelerate ($config): $LM_ENTRY $*"
exec accelerate launch --config_file "$config" "${multi[@]}" --num_machines "$nnodes" \
  --num_processes "$total" "${machine[@]}" -m "$LM_ENTRY" "$@"
