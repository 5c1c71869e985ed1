#!/usr/bin/env bash
# Multi-node torchrun with the c10d rendezvous: run this once on every node, with the same
# NNODES, MASTER_ADDR, MASTER_PORT and RDZV_ID everywhere; the Hydra overrides are passed through.
#
# Needs (environment):
#   NNODES        number of nodes, e.g. 2
#   NODE_RANK     this node's index 0..NNODES-1 (default: $SLURM_NODEID under srun)
#   MASTER_ADDR   an address of node 0 that every node can reach, e.g. node001 or 10.0.0.1
#   MASTER_PORT   a free TCP port on node 0 (default 29500)
#   RDZV_ID       names this job's rendezvous (default lm-$MASTER_PORT; under SLURM: the job id)
#   NPROC_PER_NODE, LM_ENTRY, NCCL_*: see launch/common.sh
#   LOCAL_ADDR    optional: the address this node advertises to the others (default: its hostname)
#   RDZV_TIMEOUT  optional: seconds to wait for all nodes to join (default 900)
#
# Example, two 8-GPU nodes (the run directory must be on a filesystem that every node sees):
#   node0$ NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/torchrun_multinode.sh engine=zero2 run_dir=/shared/runs/z2
#   node1$ NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 launch/torchrun_multinode.sh engine=zero2 run_dir=/shared/runs/z2
set -euo pipefail
# shellcheck source=launch/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

lm_need NNODES "the number of nodes, e.g. NNODES=2"
lm_need_count NNODES
export NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-}}"
lm_need NODE_RANK "this node's index from 0 to NNODES-1, e.g. NODE_RANK=0 on the first node"
lm_need MASTER_ADDR "an address of node 0 that every node can reach, e.g. MASTER_ADDR=node001"
export MASTER_PORT="${MASTER_PORT:-29500}"
export RDZV_ID="${RDZV_ID:-lm-$MASTER_PORT}"
lm_default_nproc
lm_need_command torchrun
lm_need_node_rank
[ "$LM_ENTRY" = lm.cli.preflight ] || lm_has_run_dir "$@" || echo "lm launch: no run_dir=... given; rank 0 names one under runs/ (every node must see it)" >&2

# c10d hands out global ranks in joining order; NODE_RANK decides which agent hosts the rendezvous
# store (node 0), rather than torchrun guessing it from hostnames, which fails behind aliases and NAT.
is_host=0
if [ "$NODE_RANK" = 0 ]; then is_host=1; fi
args=(--nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE"
  --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "$RDZV_ID"
  --rdzv_conf "timeout=${RDZV_TIMEOUT:-900},is_host=$is_host" --max_restarts 0)
if [ -n "${LOCAL_ADDR:-}" ]; then args+=(--local_addr "$LOCAL_ADDR"); fi
lm_show "node $NODE_RANK/$NNODES, $NPROC_PER_NODE process(es), rendezvous $MASTER_ADDR:$MASTER_PORT ($RDZV_ID): $LM_ENTRY $*"
# USR1 (launch/slurm.sbatch's time-limit warning, sent to every process of the job step) is for the ranks: lm's
# loop stops with a checkpoint. torchrun would die of it (and SLURM then SIGKILL the ranks mid-save), so it
# ignores USR1; the ranks inherit that until lm's loop installs its handler.
trap '' USR1
exec torchrun "${args[@]}" -m "$LM_ENTRY" "$@"
