#!/usr/bin/env bash
# Text diffusion on Multi30k, base vs + WDR heads (the diff-tiny presets, 2 CPU cores).
#
#   bash experiments/diffusion_multi30k.sh DIRECTION PRESET SEED     e.g.  de-en wdr 2
#
# Trains configs/diff-tiny-multi30k-PRESET.toml into runs/diffusion/DIRECTION-PRESET-sSEED (its
# results.json: the validation losses and test BLEU of the preset's decoding), then translates
# test_2016_flickr with K = 10 and K = 20 denoising steps at the predicted lengths (length beam
# 3) and at the reference's lengths (--oracle-length), each into a translate-*.json beside the
# run; WDR runs are decoded without and with the head ensemble at Table 10's λ = 0.1.
# De→En WDR uses Table 10's De2En N = 3 (En→De: the preset's N = 2).
# EPOCHS=N trains N epochs instead of the preset's 12; SET="key=value ..." adds --set overrides
# (put such runs in their own RUNS=dir).
# Table: targetlm compare runs/diffusion --metric bleu --lambda 0.1
set -euo pipefail
direction=$1 preset=$2 seed=$3
source_lang=${direction%-*} target_lang=${direction#*-}
LAMBDA=${LAMBDA:-0.1}
root=${RUNS:-runs/diffusion}
run=$root/$direction-$preset-s$seed
data=${TARGETLM_DATA:?set TARGETLM_DATA to the directory holding multi30k/}/multi30k
extra=()
[ "$preset" = wdr ] && [ "$direction" = de-en ] && extra=(--set model.heads.n=3)
[ -n "${EPOCHS:-}" ] && extra+=(--set train.epochs="$EPOCHS")
for override in ${SET:-}; do extra+=(--set "$override"); done
mkdir -p "$root"
if [ ! -f "$run/results.json" ]; then
  resume=(); [ -f "$run/last.pt" ] && resume=(--resume)
  targetlm train "configs/diff-tiny-multi30k-$preset.toml" --run-dir "$run" "${resume[@]}" \
    --set data.source_lang="\"$source_lang\"" --set data.target_lang="\"$target_lang\"" \
    --set train.seed="$seed" --set train.progress=false "${extra[@]}"
fi
lambdas=(0); [ "$preset" = wdr ] && lambdas=(0 "$LAMBDA")
for steps in 10 20; do
  for lam in "${lambdas[@]}"; do
    for length in predicted oracle; do
      out=$run/translate-test-k$steps-lambda$lam-$length.json
      flags=(); [ "$length" = oracle ] && flags=(--oracle-length)
      # written whole or not at all: a run stopped while decoding leaves no empty json behind
      [ -f "$out" ] || { targetlm translate "$run" --input "$data/test_2016_flickr.$source_lang" \
        --reference "$data/test_2016_flickr.$target_lang" --steps "$steps" \
        --ensemble-lambda "$lam" "${flags[@]}" --json > "$out.tmp" && mv "$out.tmp" "$out"; }
      echo "$out: $(python -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"BLEU {r['bleu']:.2f}, {r['sentences_per_s']:.1f} sentences/s\")" "$out")"
    done
  done
done
