#!/usr/bin/env bash
# The CPU speedrun side by side with nanoGPT (issue 21), and both programs' validation losses.
#
# Runs ../shared/peers/speedrun_pair.sh ROUNDS: nanoGPT's own CPU shakespeare-char recipe and
# `lm train experiment=shakespeare_char_cpu`, alternated, each timed from process start to exit, and
# the ratio of the median wall times. That script reads lm's loss at step 2000; the speedrun preset
# stops at step 1100, so this prints every round's last logged validation loss of both programs from
# the logs it leaves. Both are the mean over 20 batches of the last 10% of the text (nanoGPT draws
# random ones, lm takes the first 20).
#
#   bash benchmarks/speedrun_pair.sh [ROUNDS]     # project root, venv active; LM_PEERS=<shared/peers>
set -euo pipefail
ROUNDS=${1:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${LM_PEERS:-$ROOT/../shared/peers}
[ -f "$PEERS/speedrun_pair.sh" ] || { echo "no $PEERS/speedrun_pair.sh: set LM_PEERS to the peers folder" >&2; exit 2; }
cd "$ROOT"
# The peers' script runs `lm train` (or the old `lm-train`) from PATH: that is whichever checkout the venv has
# installed, or none (a machine without `pip install -e .`). A stand-in on PATH runs this checkout's lm instead.
shim=$(mktemp -d)
printf '#!/bin/sh\nexec python -m lm "$@"\n' > "$shim/lm" && chmod +x "$shim/lm"
export PATH="$shim:$PATH" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
out=$(mktemp)
bash "$PEERS/speedrun_pair.sh" "$ROUNDS" | tee "$out"
logs=$(sed -n 's/^logs: //p' "$out")
rm -rf "$out" "$shim"
echo "last validation loss of each round (logs in $logs):"
for r in $(seq "$ROUNDS"); do
  nano=$(grep -o 'step [0-9]*: train loss [0-9.]*, val loss [0-9.]*' "$logs/nano_$r.log" | tail -1 | sed 's/train loss [0-9.]*, //')
  ours=$(grep -o 'step [0-9]*: val_loss [0-9.]*' "$logs/lm_$r.log" | tail -1)
  echo "  round $r: nanoGPT ${nano:-none}   lm ${ours:-none}"
done
