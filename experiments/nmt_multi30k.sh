#!/usr/bin/env bash
# Multi30k translation, base vs + simple vs + WDR N-gram heads (the nmt-tiny presets,
# 2 CPU cores), each head model decoded without and with the head ensemble (λ chosen on val).
#
#   bash experiments/nmt_multi30k.sh DIRECTION PRESET SEED     e.g.  en-de wdr 1
#
# Trains configs/nmt-tiny-multi30k-PRESET.toml into runs/nmt/DIRECTION-PRESET-sSEED (its
# results.json has valid/test loss, ppl, BLEU and chrF of beam 5 with λ = 0), then for head
# models translates val with beam 5 for every λ in LAMBDAS, and test with the λ best on val
# (translate-*.json beside the run). Table: targetlm compare runs/nmt --metric bleu --lambda-on valid
# FAMILY=... picks another preset family (e.g. nmt-small-multi30k on a GPU). EPOCHS=N trains N
# epochs instead of the preset's; SET="key=value ..." adds --set overrides (e.g. the device),
# LABEL=NAME puts such a variant in runs/nmt/DIRECTION-PRESET-NAME-sSEED, e.g. a separate
# source embedding: LABEL=srcemb SET='model.source_embedding.kind="lookup"
# model.source_embedding.size=128 model.source_embedding.init_std=0.0884' ... en-de wdr 1
set -euo pipefail
direction=$1 preset=$2 seed=$3
source_lang=${direction%-*} target_lang=${direction#*-}
LAMBDAS=${LAMBDAS:-"0.1 0.3 0.5"}
FAMILY=${FAMILY:-nmt-tiny-multi30k}
root=${RUNS:-runs/nmt}
run=$root/$direction-$preset${LABEL:+-$LABEL}-s$seed
data=${TARGETLM_DATA:?set TARGETLM_DATA to the directory holding multi30k/}/multi30k
extra=()
[ -n "${EPOCHS:-}" ] && extra+=(--set train.epochs="$EPOCHS")
for override in ${SET:-}; do extra+=(--set "$override"); done
mkdir -p "$root"
if [ ! -f "$run/results.json" ]; then
  resume=(); [ -f "$run/last.pt" ] && resume=(--resume)
  targetlm train "configs/$FAMILY-$preset.toml" --run-dir "$run" "${resume[@]}" \
    --set data.source_lang="\"$source_lang\"" --set data.target_lang="\"$target_lang\"" \
    --set train.seed=$seed --set train.progress=false "${extra[@]}"
fi
[ "$preset" = base ] && exit 0
best=0 best_bleu=-1
for lam in $LAMBDAS; do
  out=$run/translate-val-lambda$lam.json
  [ -f "$out" ] || targetlm translate "$run" --input "$data/val.$source_lang" \
    --reference "$data/val.$target_lang" --beam 5 --ensemble-lambda "$lam" --json > "$out"
  bleu=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['bleu'])" "$out")
  if python -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$bleu" "$best_bleu"; then
    best=$lam best_bleu=$bleu
  fi
done
out=$run/translate-test-lambda$best.json
[ -f "$out" ] || targetlm translate "$run" --input "$data/test_2016_flickr.$source_lang" \
  --reference "$data/test_2016_flickr.$target_lang" --beam 5 --ensemble-lambda "$best" --json > "$out"
echo "$run: λ = $best chosen on val (BLEU $best_bleu); test: $(cat "$out")"
