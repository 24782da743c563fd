#!/usr/bin/env bash
# Heo et al. 2025 Table 3 at a CPU budget: SmolLM2-135M fine-tuned on WikiText-2
# (tokenized wikitext-2-v1), base vs + simple heads (N 2, α 0.1) vs + WDR heads (N 4, α 0.1).
#
#   bash experiments/smollm2_wt2.sh PRESET SEED        PRESET: base | sim | wdr | before
#
# The budget (the same for all; env vars change it): blocks of BPTT=128 tokens, BATCH=4 blocks
# per step, JOINT=60 steps of full fine-tuning (linear schedule: 6 warm-up steps, decay to 0;
# the paper's lr 1e-5) after HEADS_ONLY=60 steps in which heads models train their heads alone
# (Medusa's warm-up, heads lr 1e-3) and the base model nothing (it skips those batches, so all
# models fine-tune on the same batches); the first VALID/TEST fraction of the valid and test
# splits. "before" evaluates the pretrained model as published (no training).
# Each run: runs/smollm2/PRESET-sSEED/ with results.json (valid/test token-level ppl) and
# eval-{valid,test}.json (token- and word-level ppl, each λ of the head ensemble, and each
# head's top-1 accuracy on the word it predicts). SET="key=value ..." adds --set overrides
# (put such runs in their own RUNS=dir), e.g. identity-start heads:
#   RUNS=runs/smollm2-identity HEADS_ONLY=300 SET="model.heads.residual=true" bash ... wdr 1
# Table: targetlm compare runs/smollm2 --lambda-on valid --baseline base
set -euo pipefail
preset=$1 seed=$2
BPTT=${BPTT:-128} BATCH=${BATCH:-4} JOINT=${JOINT:-60} HEADS_ONLY=${HEADS_ONLY:-60}
VALID=${VALID:-0.02} TEST=${TEST:-0.02}
export OMP_NUM_THREADS=${THREADS:-1}
LAMBDAS=${LAMBDAS:-0,0.02,0.04,0.08,0.1,0.2,0.3,0.4,0.5}
root=${RUNS:-runs/smollm2}
run=$root/$preset-s$seed
config=configs/smollm2-wt2-${preset/before/base}.toml
common=(--set data.bptt=$BPTT --set data.batch_size=$BATCH --set model.backbone.max_context=$BPTT
  --set "data.valid=\"valid[:$VALID]\"" --set "data.test=\"test[:$TEST]\"" --set eval.batch_size=$BATCH)
extra=()
for override in ${SET:-}; do extra+=(--set "$override"); done
mkdir -p "$root"
if [ "$preset" = before ]; then
  mkdir -p "$run"
  for split in valid test; do
    [ -f "$run/eval-$split.json" ] || targetlm eval "$config" "${common[@]}" \
      --split $split --json > "$run/eval-$split.tmp" && mv "$run/eval-$split.tmp" "$run/eval-$split.json"
  done
  exit 0
fi
# every model takes the HEADS_ONLY steps: a heads model trains its heads alone in them, the base
# model trains nothing (it reads past those batches), so all three fine-tune on the same batches
steps=$((JOINT + HEADS_ONLY)) heads=(--set train.heads_only_steps=$HEADS_ONLY)
if [ ! -f "$run/results.json" ]; then
  resume=(); [ -f "$run/last.pt" ] && resume=(--resume)
  targetlm train "$config" --run-dir "$run" "${resume[@]}" "${common[@]}" "${heads[@]}" \
    --set train.max_steps=$steps --set train.eval_every=$steps --set train.warmup_steps=$((JOINT / 10)) \
    --set train.seed=$seed --set train.log_every=5 --set train.progress=false "${extra[@]}"
fi
ensemble=(); [ "$preset" != base ] && ensemble=(--ensemble-lambda "$LAMBDAS" --head-top1)
for split in valid test; do
  [ -f "$run/eval-$split.json" ] || targetlm eval "$run" --split $split "${ensemble[@]}" --json \
    > "$run/eval-$split.tmp" && mv "$run/eval-$split.tmp" "$run/eval-$split.json"
done
