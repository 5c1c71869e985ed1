# shellcheck shell=bash
# Sourced by every script in launch/: the environment that torchrun, accelerate and the deepspeed
# launcher need, with nothing specific to one cluster. Set any of these before launching.
#
#   LM_ENTRY         Python module to run: lm.cli.train (default), lm.cli.finetune, lm.cli.preflight
#   NPROC_PER_NODE   processes per node; default: $SLURM_GPUS_ON_NODE, else the GPUs in
#                    CUDA_VISIBLE_DEVICES when set, else the GPUs nvidia-smi lists, else 1 (CPU: set
#                    it yourself, each process then uses gloo)
#   OMP_NUM_THREADS  CPU threads per process; torchrun sets 1 when it starts more than one process
#   TORCH_EXTENSIONS_DIR  where DeepSpeed JIT-compiles its ops; default: one directory per host
#                    under ~/.cache, so nodes sharing a home directory never race on one build
#   TORCH_ELASTIC_SHUTDOWN_TIMEOUT  seconds torchrun (and accelerate launch) lets its ranks finish after passing
#                    them a SIGTERM or Ctrl-C (a preemption, scancel) before it SIGKILLs them; default here 300
#                    (torch's own: 30, too short for a large checkpoint). torch 2.13's torchrun reads it; one that
#                    does not keeps 30 s. A scheduler's own limit (SLURM's
#                    GraceTime / KillWait, Kubernetes' terminationGracePeriodSeconds) still ends the ranks first.
#
# NCCL (GPU collectives) reads its own variables; set them for your fabric, none is set here:
#   NCCL_DEBUG=INFO           once, to see the transport each rank picked ("NET/IB" or "NET/Socket")
#   NCCL_SOCKET_IFNAME=ib0    the interface for bootstrap and socket traffic (e.g. eth0, ^lo,docker)
#   NCCL_IB_HCA=mlx5          which InfiniBand adapters to use; NCCL_IB_DISABLE=1 forces TCP sockets
#   NCCL_NET_GDR_LEVEL=PHB    GPUDirect RDMA distance; NCCL_P2P_LEVEL / NCCL_P2P_DISABLE for NVLink/PCIe
#   FI_PROVIDER=efa           AWS EFA (with the aws-ofi-nccl plugin), FI_EFA_USE_DEVICE_RDMA=1
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=1  a dead peer fails the job instead of hanging it (torch default)
#   GLOO_SOCKET_IFNAME=eth0   the same choice for CPU (gloo) runs and for lm's CPU-side collectives
# Check a fabric before a long run with `LM_ENTRY=lm.cli.preflight` through the same launch script.

# Logs reach SLURM's output file as they are written, not when a buffer fills.
export PYTHONUNBUFFERED=1
export LM_ENTRY="${LM_ENTRY:-lm.cli.train}"
# The ranks of a stopped job save a checkpoint after the step in flight: let the scheduler's grace period bound that,
# not torchrun's 30 s (measured with torch 2.13: a rank whose save took 35 s was SIGKILLed at 30 s, and finished with 60).
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-300}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/torch_extensions/$(hostname -s)}"

lm_usage() {  # the header comment of a launch script is its help
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$1"
}

# Sourced without arguments, this file sees the calling script's own: `launch/X.sh --help` helps
# (lm train's Hydra help stays one command away: `lm train --help`).
case "${1:-}" in -h | --help) lm_usage "$0"; exit 0 ;; esac

lm_die() {
  echo "lm launch: $*" >&2
  exit 2
}

lm_need() {  # lm_need VAR "what it is and an example"
  [ -n "${!1:-}" ] || lm_die "set $1: $2"
}

lm_need_command() {
  command -v "$1" >/dev/null 2>&1 || lm_die "'$1' is not on PATH: activate the environment where lm is installed (pip install -e .)"
}

lm_gpus_on_node() {
  local devices
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    echo "$SLURM_GPUS_ON_NODE"
  elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # the GPUs this job may use (nvidia-smi lists every GPU)
    IFS=, read -r -a devices <<<"$CUDA_VISIBLE_DEVICES"
    case "${devices[0]:-}" in "" | -* | NoDevFiles) echo 1 ;; *) echo "${#devices[@]}" ;; esac
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU'
  else
    echo 1
  fi
}

lm_need_count() {  # lm_need_count VAR: a positive integer, checked before any arithmetic or launcher sees it
  [[ "${!1:-}" =~ ^[1-9][0-9]*$ ]] || lm_die "$1=${!1:-} must be a positive integer"
}

[[ "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT" =~ ^[0-9]+$ ]] ||
  lm_die "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a number of seconds"

lm_need_node_rank() {  # NODE_RANK within 0..NNODES-1 (NNODES already checked by lm_need_count)
  [[ "$NODE_RANK" =~ ^(0|[1-9][0-9]*)$ ]] && [ "$NODE_RANK" -lt "$NNODES" ] ||
    lm_die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES: this node's index, from 0 on the first node"
}

lm_default_nproc() {
  export NPROC_PER_NODE="${NPROC_PER_NODE:-$(lm_gpus_on_node)}"
  lm_need_count NPROC_PER_NODE
}

lm_has_run_dir() {  # true when the Hydra overrides pin run_dir (every rank and every restart must agree)
  local arg
  for arg in "$@"; do
    case "$arg" in run_dir=* | +run_dir=* | ++run_dir=*) return 0 ;; esac
  done
  return 1
}

lm_show() {  # one line per launch in the log: what started where
  echo "lm launch: $(hostname -s) $*" >&2
}
