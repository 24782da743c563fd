#!/usr/bin/env bash
# Heo et al.'s Table 1 analog on PTB with the small LSTM (configs/heo-lstm-ptb-*),
# at the reduced budget of experiments/common.sh, one seed per call:
#   bash experiments/heo_lstm_ptb.sh SEED [METHOD ...]     (default: all seven presets)
# Every run is evaluated on valid and test at λ ∈ {0, 0.2, 0.4, 0.6} (heads run once per split).
set -euo pipefail
source "$(dirname "$0")/common.sh"
seed=${1:?seed}
shift
methods=("$@")
[[ ${#methods[@]} -gt 0 ]] || methods=(base sim-n2 sim-n3 sim-n4 wdr-n2 wdr-n3 wdr-n4)
root=${RUNS:-runs/heo-lstm-ptb}
for method in "${methods[@]}"; do
  dir="$root/$method-s$seed"
  train_reduced "configs/heo-lstm-ptb-$method.toml" "$dir" "$seed"
  ensemble=(--ensemble-lambda 0,0.2,0.4,0.6)
  [[ $method == base ]] && ensemble=()
  for split in valid test; do
    targetlm eval "$dir" --split "$split" "${ensemble[@]}" --json > "$dir/eval-$split.json"
  done
done
