#!/usr/bin/env bash
# Heo et al. 2024 Table 2 (PTB) in the CPU regime: the Tensorized Transformer (tt-ptb-*) and the
# Reformer (rf-ptb-*) with the paper's blocks, objective, optimiser and Table 6 heads on narrower
# models and less data, the same budget for every arm (base, sim, wdr; 2 seeds each):
#   tt: 3 layers (Table 5) x d 128, rank 40, d_ff 512, windows of 32 tokens, batch 32 (1K tokens),
#       Adam 0.00067 (Table 5's 0.0025 scaled linearly to a batch 3.75x smaller: at 0.0025 the
#       model never left the unigram level, valid 411-440 for 30 epochs) with the preset's
#       cosine decay over the budget, clip 0.25;
#   rf: 6 layers sharing their weights x d 128, 4 heads of 32, buckets of 32, 4 hashing rounds,
#       blocks of 256 tokens, batch 4 (1K tokens), no accumulation, Adam 1e-4, clip 0.5;
# on the first TOKENS training tokens (default 50k), validated every epoch on the first quarter of
# valid, patience PATIENCE (default 5) within EPOCHS (default 30) epochs, best checkpoint kept.
# One run per call, one thread:
#   bash experiments/tt_rf_ptb.sh MODEL METHOD SEED     (MODEL: tt, rf; METHOD: base, sim, wdr)
# then each run is evaluated on full valid and test; a run with heads at λ ∈ {0, 0.1, ..., 0.6},
# so λ is chosen on valid and read on test at that λ. The rf runs need the reformer extra
# (bash scripts/setup.sh --reformer). SET="key=value ..." adds --set overrides.
set -euo pipefail
source "$(dirname "$0")/common.sh"
model=${1:?model (tt or rf)}
method=${2:?method (base, sim, wdr)}
seed=${3:?seed}
case $model in
  tt) size=(--set model.embedding.size=128 --set model.encoder.ff_size=512
        --set data.batch_size=32 --set train.lr=0.00067) ;;
  rf) size=(--set model.embedding.size=128 --set model.encoder.model_size=128
        --set model.encoder.num_heads=4 --set model.encoder.head_size=32
        --set model.encoder.bucket_size=32 --set model.encoder.max_context=256
        --set data.bptt=256 --set data.batch_size=4 --set train.accumulate=1
        --set eval.segment=128 --set eval.batch_size=8) ;;
  *) echo "tt_rf_ptb.sh: MODEL must be tt or rf, got $model" >&2; exit 2 ;;
esac
case $method in base | sim | wdr) ;; *) echo "tt_rf_ptb.sh: unknown METHOD $method" >&2; exit 2 ;; esac
root=${RUNS:-runs/tt-rf-ptb}
tokens=${TOKENS:-50000} epochs=${EPOCHS:-30} patience=${PATIENCE:-5}
dir="$root/$model-$method${LABEL:+-$LABEL}-s$seed"
extra=()
for override in ${SET:-}; do extra+=(--set "$override"); done
train_or_resume "$dir" "configs/$model-ptb-$method.toml" \
  --set train.seed="$seed" --set data.train_tokens="$tokens" "${size[@]}" \
  --set data.valid='"valid[:0.25]"' \
  --set train.epochs="$epochs" --set train.max_steps=0 --set train.early_stopping="$patience" \
  --set train.log_every=50 --set train.threads=1 --set train.progress=false "${extra[@]}"
ensemble=(--ensemble-lambda 0,0.1,0.2,0.3,0.4,0.5,0.6)
[[ $method == base ]] && ensemble=()
eval_splits "$dir" "${ensemble[@]}"
