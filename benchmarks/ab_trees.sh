#!/usr/bin/env bash
# Two checkouts of lm side by side in one run (a change that touches the step: "not slower than before").
#
#   bash benchmarks/ab_trees.sh speedrun OLD NEW [ROUNDS]   # nanoGPT, lm in OLD, lm in NEW, alternated
#                                                            # (NANOGPT=0: the two lm trees only)
#   bash benchmarks/ab_trees.sh hf_step OLD NEW [STEPS]     # benchmarks/hf_step.py in OLD and NEW, per layout x vocab
#
# OLD and NEW are directories holding a checkout each (e.g. `git worktree add /tmp/old <commit>`); each runs
# with PYTHONPATH at its own tree in this venv. speedrun: nanoGPT's CPU shakespeare-char recipe (LM_PEERS, as
# benchmarks/speedrun_pair.sh) and `lm train experiment=shakespeare_char_cpu`, each timed from process start
# to exit, with the last validation loss of each. hf_step: one JSON line per run, ours / HF in one process.
# The order of the arms alternates (speedrun: round by round, nanoGPT old new, then new old nanoGPT; hf_step: layout x
# vocab by layout x vocab), so a drift of the machine (heat, caches, other load) does not always land on one arm.
set -euo pipefail
MODE=$1; OLD=$(cd "$2" && pwd); NEW=$(cd "$3" && pwd); N=${4:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=${LM_DATA_MIRROR:-$ROOT/../shared/data}; PEERS=${LM_PEERS:-$ROOT/../shared/peers}
lm_in() { (cd "$1" && shift && PYTHONPATH=$PWD LM_DATA_MIRROR=$DATA WANDB_MODE=offline "$@"); }
case $MODE in
speedrun)
  W=$(mktemp -d)
  cp -r "$PEERS/nanogpt" "$W/nanogpt"
  cp "$DATA/text/tinyshakespeare/input.txt" "$W/nanogpt/data/shakespeare_char/"
  (cd "$W/nanogpt/data/shakespeare_char" && python prepare.py >/dev/null)
  nano() {
    s=$(date +%s.%N)
    (cd "$W/nanogpt" && OMP_NUM_THREADS=$(nproc) python train.py config/train_shakespeare_char.py --device=cpu \
      --compile=False --eval_iters=20 --log_interval=100 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 \
      --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 >"$W/nano_$r.log" 2>&1)
    echo "  nanoGPT wall $(echo "$(date +%s.%N) - $s" | bc) s $(grep 'step 2000' "$W/nano_$r.log" | sed 's/.*val loss/val loss/')"
  }
  ours() {  # ours old|new
    local side=$1 tree=$OLD; [ "$1" = new ] && tree=$NEW
    s=$(date +%s.%N)
    LM_CACHE=$W/cache_$side lm_in "$tree" python -m lm train experiment=shakespeare_char_cpu \
      run_dir="$W/${side}_$r" >"$W/${side}_$r.log" 2>&1
    echo "  lm-$side wall $(echo "$(date +%s.%N) - $s" | bc) s $(grep -o 'step [0-9]*: val_loss [0-9.]*' "$W/${side}_$r.log" | tail -1)"
  }
  arms=(old new); [ "${NANOGPT:-1}" != 0 ] && arms=(nano old new)
  for r in $(seq "$N"); do
    echo "round $r: load $(cut -d' ' -f1-3 /proc/loadavg)"
    order=("${arms[@]}"); [ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${arms[@]}" | tac))  # neither always first
    for arm in "${order[@]}"; do
      if [ "$arm" = nano ]; then nano; else ours "$arm"; fi
    done
  done
  echo "logs: $W" ;;
hf_step)
  i=0
  for cfg in "gpt2 65" "gpt2 50304" "llama 65" "llama 50304"; do
    read -r layout vocab <<<"$cfg"
    sides="old new"; [ $((i++ % 2)) = 1 ] && sides="new old"  # neither tree always runs first
    for side in $sides; do
      tree=$OLD; [ "$side" = new ] && tree=$NEW
      echo "$side $(lm_in "$tree" python benchmarks/hf_step.py --layout "$layout" --vocab "$vocab" --steps "$N" --json 2>/dev/null | tail -1)"
    done
  done ;;
*) echo "usage: bash benchmarks/ab_trees.sh speedrun|hf_step OLD NEW [N]" >&2; exit 2 ;;
esac
