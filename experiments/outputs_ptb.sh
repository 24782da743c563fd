#!/usr/bin/env bash
# Issue 4: the output-embedding comparison on PTB (configs/outputs-ptb-*: the same 2x200 LSTM
# prefix, only [model.output] differs) at the reduced budget of experiments/common.sh:
#   bash experiments/outputs_ptb.sh SEED [METHOD ...]   (default: all ten)
# Needs WordNet for the GroC rows (bash scripts/install_wordnet.sh $TARGETLM_DATA).
set -euo pipefail
source "$(dirname "$0")/common.sh"
seed=${1:?seed}
shift
methods=("$@")
[[ ${#methods[@]} -gt 0 ]] ||
  methods=(lookup tied bilinear residual adaptive charcnn groc groc-norel groc-nodef groc-noreldef)
root=${RUNS:-runs/outputs-ptb}
for method in "${methods[@]}"; do
  train_reduced "configs/outputs-ptb-$method.toml" "$root/$method-s$seed" "$seed"
done
