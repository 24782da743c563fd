#!/usr/bin/env bash
# Issue 5: Heo et al.'s Table 1 analog on PTB with the small LSTM (configs/heo-lstm-ptb-*),
# at a reduced CPU budget, one seed per call:
#   bash experiments/heo_lstm_ptb.sh SEED [METHOD ...]     (default: all seven presets)
# Budget (ours, stated in docs/results.md): the first TOKENS training tokens (default 300k of
# 930k), EPOCHS epochs (default 2), lr 1 then halved every epoch; one thread per run, so two
# calls run side by side on 2 cores. Every run is then evaluated on valid and test at
# λ ∈ {0, 0.2, 0.4, 0.6} (the heads run once per split).
set -euo pipefail
seed=${1:?seed}
shift
methods=("$@")
[[ ${#methods[@]} -gt 0 ]] || methods=(base sim-n2 sim-n3 sim-n4 wdr-n2 wdr-n3 wdr-n4)
tokens=${TOKENS:-300000}
epochs=${EPOCHS:-2}
root=${RUNS:-runs/heo-lstm-ptb}
for method in "${methods[@]}"; do
  dir="$root/$method-s$seed"
  if [[ ! -f "$dir/results.json" ]]; then
    targetlm train "configs/heo-lstm-ptb-$method.toml" --run-dir "$dir" \
      --set train.seed="$seed" --set data.train_tokens="$tokens" --set train.epochs="$epochs" \
      --set train.decay_start=1 --set train.decay_factor=0.5 \
      --set train.threads=1 --set train.progress=false
  fi
  lambdas=0,0.2,0.4,0.6
  [[ $method == base ]] && lambdas=""
  for split in valid test; do
    if [[ -n $lambdas ]]; then
      targetlm eval "$dir" --split "$split" --ensemble-lambda "$lambdas" --json > "$dir/eval-$split.json"
    else
      targetlm eval "$dir" --split "$split" --json > "$dir/eval-$split.json"
    fi
  done
done
