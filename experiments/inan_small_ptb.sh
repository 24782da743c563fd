#!/usr/bin/env bash
# PTB small (2x200) base / AL / RE / REAL at a reduced CPU budget, one seed per call.
#   bash experiments/inan_small_ptb.sh SEED [EPOCHS]
# Budget (ours, stated in docs/history.md): EPOCHS epochs (default 2) with the paper's
# settings except a compressed schedule, lr 1 halved after every epoch (decay_start 1,
# factor 0.5), one thread per run so two seeds run side by side on 2 cores.
set -euo pipefail
seed=${1:?seed}
epochs=${2:-2}
root=${RUNS:-runs/inan-small-ptb}
for method in base re al real; do
  dir="$root/$method-s$seed"
  if [[ -f "$dir/results.json" ]]; then continue; fi
  targetlm train "configs/inan-small-ptb-$method.toml" --run-dir "$dir" \
    --set train.seed="$seed" --set train.epochs="$epochs" \
    --set train.decay_start=1 --set train.decay_factor=0.5 \
    --set train.threads=1 --set train.progress=false
done
