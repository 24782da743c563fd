#!/usr/bin/env bash
# Heo et al. 2025 Table 1 (PTB, the small decoder Transformer, tf-small-ptb-*)
# in the CPU regime: the paper's block (post-LN, ReLU, tied, dropout 0.3, label smoothing 0.1,
# Adam 2.5e-4 without clipping) narrowed to 2 layers x d 128 (d_ff 512, 4 heads), blocks of
# 128 tokens, batch 8 (1K tokens), on the first TOKENS training tokens (default 50k), validated
# every epoch on the first quarter of valid, patience PATIENCE (default 5; paper 50) within
# EPOCHS (default 30) epochs, best checkpoint kept. One run per call, one thread:
#   bash experiments/heo_tf_ptb.sh METHOD SEED        (METHOD: base, sim-n2 .. wdr-n4)
# then each run is evaluated on full valid and test at λ ∈ {0, 0.2, 0.4, 0.6} (heads once), with
# each head's top-1 accuracy on the word it predicts.
# DIVERSITY=K measures gradient diversity every K steps (Heo et al. Fig. 2).
#
# REGIME=large (the second CPU regime): 3 layers x d 256 with the paper's d_ff 2100, blocks of
# 128 tokens, batch 8, the first 100k training tokens (about 98 steps an epoch; Adam at a
# constant rate, so no schedule is compressed by the smaller epoch), patience 8 within 60
# epochs, in runs/heo-tf-ptb-large. SET="key=value ..." adds --set overrides (ablations).
set -euo pipefail
source "$(dirname "$0")/common.sh"
method=${1:?method}
seed=${2:?seed}
if [[ ${REGIME:-small} == large ]]; then
  root=${RUNS:-runs/heo-tf-ptb-large}
  size=(--set model.encoder.num_layers=3 --set model.embedding.size=256
    --set model.encoder.ff_size=2100)
  tokens=${TOKENS:-100000} epochs=${EPOCHS:-60} patience=${PATIENCE:-8}
else
  root=${RUNS:-runs/heo-tf-ptb}
  size=(--set model.encoder.num_layers=2 --set model.embedding.size=128
    --set model.encoder.ff_size=512)
  tokens=${TOKENS:-50000} epochs=${EPOCHS:-30} patience=${PATIENCE:-5}
fi
dir="$root/$method${LABEL:+-$LABEL}-s$seed"
extra=()
[[ -n ${DIVERSITY:-} ]] && extra=(--set train.gradient_diversity_every="$DIVERSITY")
for override in ${SET:-}; do extra+=(--set "$override"); done
train_or_resume "$dir" "configs/tf-small-ptb-$method.toml" \
  --set train.seed="$seed" --set data.train_tokens="$tokens" "${size[@]}" \
  --set model.encoder.max_context=128 \
  --set data.bptt=128 --set data.batch_size=8 --set eval.segment=64 \
  --set data.valid='"valid[:0.25]"' \
  --set train.epochs="$epochs" --set train.early_stopping="$patience" \
  --set train.threads=1 --set train.progress=false "${extra[@]}"
ensemble=(--ensemble-lambda 0,0.2,0.4,0.6 --head-top1)
[[ $method == base ]] && ensemble=()
eval_splits "$dir" "${ensemble[@]}"
