#!/usr/bin/env bash
# Heo et al. 2024 Table 2 (PTB and WikiText-2 columns) on one GPU: the Tensorized Transformer
# (tt-{ptb,wt2}-{base,sim,wdr}: 3 layers x d 256, rank 40, 32-token windows, Adam 0.0025 with
# cosine decay) and the Reformer through reformer-pytorch (rf-{ptb,wt2}-{base,sim,wdr}: 6 shared
# layers x d 512, LSH attention, 4,096-token sequences, Adam 1e-4), heads with Table 6's N, seeds
# SEEDS (default 1), 12 runs side by side, each capped by train.max_steps to fit the 25-minute
# budget (experiments/gpu/common.sh: the step rate measured in the first minute; far below the
# presets' 20,000 / 100,000 steps). Then valid and test perplexity, the heads' runs at
# λ ∈ {0, 0.1, ..., 0.6} (the paper's grid), so λ is chosen on valid.
# The rf runs need reformer-pytorch (bash scripts/setup.sh --reformer); without it the pack says
# so and runs the tt runs only.
#
#   bash experiments/gpu/tt_rf.sh OUT_DIR        (SMOKE=1: one CPU step each, tiny models)
#
# Table: targetlm compare OUT_DIR/records --group-by preset --lambda-on valid --metric ppl
PACK=tt_rf
source "$(dirname "$0")/common.sh"
SMOKE_SETS='data.train_tokens=3000 data.valid="valid[:0.01]" data.test="test[:0.01]"
  model.embedding.size=32 data.batch_size=2 eval.batch_size=2'
# per backbone, under SMOKE=1 only: shrink the encoder (its options differ between the two)
TT_SMOKE='model.encoder.ff_size=64 model.encoder.rank=8'
RF_SMOKE='model.encoder.model_size=32 model.encoder.num_heads=2 model.encoder.head_size=16
  model.encoder.bucket_size=8 model.encoder.max_context=64 data.bptt=64 train.accumulate=1
  eval.segment=32'
# the interpreter of targetlm (TARGETLM_PYTHON overrides) tells whether reformer-pytorch is there
python=${TARGETLM_PYTHON:-$(head -n 1 "$(command -v targetlm 2> /dev/null || echo /dev/null)" | sed -n 's/^#!//p')}
models=(tt rf)
if ! ${python:-python} -c 'import importlib.util as u, sys; sys.exit(u.find_spec("reformer_pytorch") is None)' 2> /dev/null; then
  echo "$PACK: the rf runs are skipped: reformer-pytorch is not installed (bash scripts/setup.sh --reformer)"
  models=(tt)
fi
gpu_init "$@"
for seed in ${SEEDS:-1}; do
  for model in "${models[@]}"; do
    smoke=()
    if [[ $SMOKE == 1 ]]; then
      if [[ $model == tt ]]; then read -ra smoke -d '' <<< "$TT_SMOKE"; else read -ra smoke -d '' <<< "$RF_SMOKE"; fi
    fi
    for corpus in ptb wt2; do
      for method in base sim wdr; do
        add_run "$model-$corpus-$method-s$seed" "configs/$model-$corpus-$method.toml" \
          train.seed="$seed" "${smoke[@]}"
      done
    done
  done
done
plan_and_train
evaluate() {  # the paper's λ grid for the heads models (the heads run once per split)
  local lambdas=(--ensemble-lambda 0,0.1,0.2,0.3,0.4,0.5,0.6)
  [[ $1 == *-base-* ]] && lambdas=()
  eval_lm "$1" "${lambdas[@]}"
}
evaluate_all evaluate
COMPARE_ARGS="--group-by preset --lambda-on valid --metric ppl"
save_records
