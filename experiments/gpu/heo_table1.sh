#!/usr/bin/env bash
# Heo et al. 2025 Table 1 on one GPU: all seven tf-small-ptb-* presets (base, Sim / WDR with
# N = 2, 3, 4: the paper's 6 x d 256 decoder, dropout 0.3, label smoothing 0.1, Adam 2.5e-4,
# patience 50) on all of PTB, seeds SEEDS (default 1 2 3), 21 runs side by side, each capped by
# train.max_steps to fit the 25-minute budget (experiments/gpu/common.sh: the step rate measured
# in the first minute); then test and valid perplexity at λ ∈ {0, 0.2, 0.4, 0.6}.
#
#   bash experiments/gpu/heo_table1.sh OUT_DIR        (SMOKE=1: one CPU step each)
#
# Table: targetlm compare OUT_DIR/records --group-by preset --lambda-on valid --metric ppl
PACK=heo_table1
source "$(dirname "$0")/common.sh"
# the smoke runs also shrink the model (21 full-size steps take minutes on a loaded CPU)
SMOKE_SETS='data.train_tokens=3000 data.valid="valid[:0.01]" data.test="test[:0.01]"
  model.encoder.num_layers=1 model.embedding.size=32 model.encoder.ff_size=64'
gpu_init "$@"
for seed in ${SEEDS:-1 2 3}; do
  for method in base sim-n2 sim-n3 sim-n4 wdr-n2 wdr-n3 wdr-n4; do
    add_run "$method-s$seed" "configs/tf-small-ptb-$method.toml" train.seed="$seed"
  done
done
plan_and_train
evaluate() {  # every λ of Table 1 for the heads models (the heads run once per split)
  local lambdas=(--ensemble-lambda 0,0.2,0.4,0.6)
  [[ $1 == base-* ]] && lambdas=()
  eval_lm "$1" "${lambdas[@]}"
}
evaluate_all evaluate
COMPARE_ARGS="--group-by preset --lambda-on valid --metric ppl"
save_records
