#!/usr/bin/env bash
# Inan et al. 2017 Table 1, PTB small on one GPU: inan-small-ptb-{base,al,re,real} unchanged
# (VD-LSTM 2 x 200, dropout 0.3, SGD lr 1 decayed x0.9 per epoch after epoch 5, 40 epochs) on all
# of PTB, seeds SEEDS (default 1 2 3), 18 runs side by side (the controls below included), each capped by train.max_steps to fit
# the 25-minute budget (experiments/gpu/common.sh: the step rate measured in the first minute;
# the per-epoch decay stays per epoch, so a cap below 40 epochs ends before the rate is small);
# then valid and test perplexity. With them the audit's two controls, same seeds: RE with an
# output bias (re-bias) and the base model without one (base-nobias): is RE's loss against the
# base the bias or the tying? CONTROLS=0 leaves the controls out: the paper's four arms alone,
# 12 runs with 3 seeds, each faster where the runs share the device's throughput.
#
#   bash experiments/gpu/inan_table1.sh OUT_DIR        (SMOKE=1: one CPU step each)
#
# Table: targetlm compare OUT_DIR/records --group-by preset --metric ppl
PACK=inan_table1
source "$(dirname "$0")/common.sh"
[[ ${CONTROLS:-1} =~ ^[01]$ ]] || { echo "$PACK: CONTROLS must be 0 or 1, got '$CONTROLS'" >&2; exit 2; }
SMOKE_SETS='data.train_tokens=3000 data.valid="valid[:0.01]" data.test="test[:0.01]"'
gpu_init "$@"
for seed in ${SEEDS:-1 2 3}; do
  for method in base al re real; do
    add_run "$method-s$seed" "configs/inan-small-ptb-$method.toml" train.seed="$seed"
  done
  [[ ${CONTROLS:-1} == 0 ]] && continue
  add_run "re-bias-s$seed" configs/inan-small-ptb-re.toml train.seed="$seed" model.output.bias=true
  add_run "base-nobias-s$seed" configs/inan-small-ptb-base.toml train.seed="$seed" \
    model.output.bias=false
done
plan_and_train
evaluate_all eval_lm
COMPARE_ARGS="--group-by preset --metric ppl"
save_records
