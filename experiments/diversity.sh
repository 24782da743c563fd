#!/usr/bin/env bash
# Gradient diversity (Yin et al. 2018; Heo et al. 2025, Fig. 2) during training,
# Sim vs WDR heads with N = 4, measured every K steps (default 10) on the first TOKENS
# training tokens (default 100k, one epoch, the presets' Adam at 0.002), seed 1; then the plot:
#   bash experiments/diversity.sh && python experiments/plot_diversity.py
set -euo pipefail
TOKENS=${TOKENS:-100000}
source "$(dirname "$0")/common.sh"
root=${RUNS:-runs/diversity}
every=${EVERY:-10}
for method in sim-n4 wdr-n4; do
  train_reduced "configs/heo-lstm-ptb-$method.toml" "$root/$method-s1" 1 \
    --set train.gradient_diversity_every="$every"
done
