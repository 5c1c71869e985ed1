#!/usr/bin/env bash
# Many nodes with the `deepspeed` launcher and a hostfile: run it once, on the first host; it starts
# every rank over ssh (pdsh) or MPI. Every host needs the same paths (repository, environment,
# data, run directory) and passwordless ssh from this host.
#
# Needs (environment):
#   HOSTFILE      lines of "<host> slots=<GPUs>", the first host being this one (see
#                 launch/hostfile.example; DeepSpeed's format)
#   MASTER_ADDR   optional: the first host's address as the others see it (default: its name in HOSTFILE)
#   MASTER_PORT   optional: a free port on it (default 29500)
#   DS_LAUNCHER   optional: pdsh (default), openmpi, mvapich, slurm, impi
#   DS_ARGS       optional: more launcher flags, e.g. "--ssh_port 2222" or "--include node001:0,1"
#   LM_ENTRY, NCCL_*, TORCH_EXTENSIONS_DIR: see launch/common.sh
# Variables reach the remote ranks only through DeepSpeed's export list (NCCL*, PYTHON*, UCX*, ...);
# this script adds LM_*, WANDB_*, HF_*, OMP_*, GLOO_*, TORCH_*, FI_* through an env file (DS_ENV_FILE).
#
# Example, two 8-GPU hosts:
#   printf 'node001 slots=8\nnode002 slots=8\n' > hosts
#   HOSTFILE=hosts launch/deepspeed_hostfile.sh engine=zero3 run_dir=/shared/runs/z3
set -euo pipefail
# shellcheck source=launch/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

lm_need HOSTFILE "a DeepSpeed hostfile, lines of '<host> slots=<GPUs>', e.g. HOSTFILE=launch/hostfile.example"
[ -f "$HOSTFILE" ] || lm_die "HOSTFILE=$HOSTFILE does not exist"
lm_need_command deepspeed
first_host="$(awk '!/^[[:space:]]*(#|$)/ {print $1; exit}' "$HOSTFILE")"
[ -n "$first_host" ] || lm_die "HOSTFILE=$HOSTFILE lists no host"
lm_has_run_dir "$@" || lm_die "pass run_dir=... on a filesystem that every host sees (ranks on other hosts must agree on it)"

env_file="$(mktemp "${TMPDIR:-/tmp}/lm-deepspeed-env.XXXXXX")"
trap 'rm -f "$env_file"' EXIT
env | grep -E '^(LM_|WANDB_|HF_|OMP_|GLOO_|TORCH_|FI_)[A-Za-z0-9_]*=' >"$env_file" || true
export DS_ENV_FILE="$env_file"

lm_show "hostfile $HOSTFILE ($(grep -cvE '^[[:space:]]*(#|$)' "$HOSTFILE") host(s)), launcher ${DS_LAUNCHER:-pdsh}: $LM_ENTRY $*"
read -r -a extra <<<"${DS_ARGS:-}"
deepspeed --hostfile "$HOSTFILE" --launcher "${DS_LAUNCHER:-pdsh}" "${extra[@]}" \
  --master_addr "${MASTER_ADDR:-$first_host}" --master_port "${MASTER_PORT:-29500}" \
  --module "$LM_ENTRY" "$@"
