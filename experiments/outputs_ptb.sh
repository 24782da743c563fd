#!/usr/bin/env bash
# The output-embedding comparison on PTB (configs/outputs-ptb-*: the same 2x200 LSTM
# prefix and Adam recipe, only [model.output] differs).
#   bash experiments/outputs_ptb.sh SEED [METHOD ...]   (default: all ten)
# Environment:
#   BUDGET=reduced (default): the CPU budget of experiments/common.sh (TOKENS, EPOCHS, 1 thread)
#   BUDGET=full: the presets' own budget (all of PTB, their epochs and schedule)
#   DEVICE=cpu|cuda (default cpu); JOBS=N runs N methods at once (default 1); RUNS=root folder
# Needs WordNet for the GroC rows (bash scripts/install_wordnet.sh $TARGETLM_DATA).
set -euo pipefail
source "$(dirname "$0")/common.sh"
seed=${1:?seed}
shift
methods=("$@")
[[ ${#methods[@]} -gt 0 ]] ||
  methods=(lookup tied bilinear residual adaptive charcnn groc groc-norel groc-nodef groc-noreldef)
root=${RUNS:-runs/outputs-ptb}
budget=${BUDGET:-reduced}
jobs=${JOBS:-1}
device=(--set train.device="\"${DEVICE:-cpu}\"")

one() {
  local method=$1 dir="$root/$1-s$seed"
  local config="configs/outputs-ptb-$method.toml"
  if [[ $budget == full ]]; then
    [[ -f "$dir/results.json" ]] && return 0
    targetlm train "$config" --run-dir "$dir" --set train.seed="$seed" \
      --set train.progress=false "${device[@]}"
  else
    train_reduced "$config" "$dir" "$seed" "${device[@]}"
  fi
}

mkdir -p "$root"
for method in "${methods[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  one "$method" >"$root/$method-s$seed.log" 2>&1 &
done
status=0
for job in $(jobs -p); do wait "$job" || status=1; done
exit $status
