#!/usr/bin/env bash
# Pappas et al. 2020 Table 2 (PTB, closed vocabulary) on one GPU: pappas-ptb-{tied,adaptive,groc}
# (the paper's 2 x 1024 AWD-style LSTM prefix, Adam 0.001, clip 0.1, hidden dropout 0.65, lr
# x0.1 after 4 flat epochs, stop after 8) on all of PTB, seeds SEEDS (default 1 2), 6 runs side
# by side, each capped by train.max_steps to fit the 25-minute budget (experiments/gpu/common.sh:
# the step rate measured in the first minute); then valid and test perplexity.
# GroC needs WordNet: bash scripts/install_wordnet.sh "$TARGETLM_DATA".
#
#   bash experiments/gpu/pappas_table2.sh OUT_DIR        (SMOKE=1: one CPU step each)
#
# Table: targetlm compare OUT_DIR/records --group-by preset --metric ppl
PACK=pappas_table2
source "$(dirname "$0")/common.sh"
SMOKE_SETS='data.train_tokens=3000 data.valid="valid[:0.01]" data.test="test[:0.01]"'
gpu_init "$@"
for seed in ${SEEDS:-1 2}; do
  for method in tied adaptive groc; do
    add_run "$method-s$seed" "configs/pappas-ptb-$method.toml" train.seed="$seed"
  done
done
plan_and_train
evaluate_all eval_lm
COMPARE_ARGS="--group-by preset --metric ppl"
save_records
