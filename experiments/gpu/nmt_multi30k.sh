#!/usr/bin/env bash
# Heo et al. 2025's "Small Enc-Dec TF NMT" (Table 4's model; IWSLT14 is not here) on Multi30k,
# one GPU: nmt-small-multi30k-{base,sim,wdr} (d 512, 6 + 6 layers, dropout 0.3, heads N 3, α 1,
# patience 50), En→De and De→En, seeds SEEDS (default 1 2), 12 runs side by side, each capped
# by train.max_steps to fit the 25-minute budget (experiments/gpu/common.sh: the step rate
# measured in the first minute; EVAL_RESERVE_S defaults to 300 here for beam search). Then, as
# experiments/nmt_multi30k.sh: each heads model translates val with beam 5 at every λ of
# LAMBDAS (default 0.1 0.3 0.5) and test at the λ best on val (translate-*.json); the base's
# test BLEU is in its results.json.
#
#   bash experiments/gpu/nmt_multi30k.sh OUT_DIR        (SMOKE=1: one CPU step, 10 sentences)
#
# Table: targetlm compare OUT_DIR/records --group-by label --lambda-on valid --metric bleu
PACK=nmt_multi30k
source "$(dirname "$0")/common.sh"
EVAL_RESERVE_S=${EVAL_RESERVE_S:-300}
# the smoke runs also shrink the model and decode greedily: an untrained model writes to the
# length limit, and beam 5 of the full model takes minutes a sentence on a loaded CPU
SMOKE_SETS='data.train="train[:0.002]" data.valid="val[:0.01]" data.test="test_2016_flickr[:0.01]"
  data.vocab_size=300 model.embedding.size=32 model.encoder.ff_size=64 model.encoder.encoder_layers=1
  model.encoder.decoder_layers=1 eval.beam=1'
gpu_init "$@"
data=$TARGETLM_DATA/multi30k beam=5
if [[ $SMOKE == 1 ]]; then  # the decoding inputs, cut like the smoke runs' splits
  mkdir -p "$OUT_DIR/smoke-data"
  for file in val.en val.de test_2016_flickr.en test_2016_flickr.de; do
    head -n 10 "$data/$file" > "$OUT_DIR/smoke-data/$file"
  done
  data=$OUT_DIR/smoke-data
  beam=1
fi
for seed in ${SEEDS:-1 2}; do
  for direction in en-de de-en; do
    for preset in base sim wdr; do
      add_run "$direction-$preset-s$seed" "configs/nmt-small-multi30k-$preset.toml" \
        data.source_lang="\"${direction%-*}\"" data.target_lang="\"${direction#*-}\"" train.seed="$seed"
    done
  done
done
plan_and_train
translate_run() {  # λ chosen on val by BLEU, then test at that λ (heads models)
  local name=$1 dir=$OUT_DIR/runs/$1 lam best="" best_bleu=-1 bleu out
  local source=${name%%-*} rest=${name#*-}
  local target=${rest%%-*}
  [[ $name == *-base-* ]] && return 0
  for out in "$dir"/translate-*.json; do  # a translation of an earlier best.pt (trained since)
    [[ -f $out && ! $out -nt $dir/best.pt ]] && rm -f "$out"
  done
  for lam in ${LAMBDAS:-0.1 0.3 0.5}; do
    out=$dir/translate-val-lambda$lam.json
    [[ -f $out ]] || { targetlm translate "$dir" --input "$data/val.$source" \
      --reference "$data/val.$target" --beam "$beam" --ensemble-lambda "$lam" --json > "$out.tmp" \
      2>> "$OUT_DIR/logs/$name.txt" && mv "$out.tmp" "$out"; } \
      || { echo "$PACK: translation failed: $name val λ $lam" >&2; return 1; }
    bleu=$(sed -E 's/.*"bleu": ([-0-9.e]+).*/\1/' "$out")
    if awk -v a="$bleu" -v b="$best_bleu" 'BEGIN { exit !(a > b) }'; then best=$lam best_bleu=$bleu; fi
  done
  out=$dir/translate-test-lambda$best.json
  [[ -f $out ]] || { targetlm translate "$dir" --input "$data/test_2016_flickr.$source" \
    --reference "$data/test_2016_flickr.$target" --beam "$beam" --ensemble-lambda "$best" --json \
    > "$out.tmp" 2>> "$OUT_DIR/logs/$name.txt" && mv "$out.tmp" "$out"; } \
    || { echo "$PACK: translation failed: $name test λ $best" >&2; return 1; }
}
evaluate_all translate_run
COMPARE_ARGS="--group-by label --lambda-on valid --metric bleu"
save_records
