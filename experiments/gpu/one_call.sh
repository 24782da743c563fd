#!/usr/bin/env bash
# One device call on a lent GPU, prepared to end inside its 10 minutes: the training-step
# benchmark (benchmarks/gpu_step.py: eager against train.compile, the loss difference from eager),
# then one paper table's pack with the fast step (experiments/gpu/<PACK>.sh, train.compile =
# "graphs"), then everything small packed into one archive.
#
#   bash experiments/gpu/one_call.sh ARCHIVE_DIR     (e.g. "$OUT" on the device machine)
#
# The machine has torch but no registry: targetlm runs from src/ (PYTHONPATH) with a `targetlm`
# command that is `python3 -m targetlm`; its lazy optional imports need nothing more for the LSTM
# and Transformer packs. TARGETLM_DATA defaults to .gpu_data/ in the checkout (PTB copied there
# and carried with the call: `mkdir -p .gpu_data && cp -r "$TARGETLM_DATA/ptb" .gpu_data/`,
# with /.gpu_data/ in .git/info/exclude).
#
# Environment: CALL_S (default 570: the seconds this script may take), BENCH_S (default 150: the
# benchmark's share, stopped at that; 0: no benchmark), PACK (default inan_table1),
# BENCH_PRESETS, WORK (default /tmp/one_call: the runs, kept on a warm machine between calls),
# MORE_STEPS (a second call on the same warm machine: every run's cap in WORK's plan.tsv raised
# by this many steps, the same for every arm, and the runs resumed), and the pack's own
# variables (SEEDS, PROBE_S, EVAL_RESERVE_S, COMPILE, ...).
# SMOKE=1: on the CPU, the wiring only (the benchmark's --quick stand-ins, the pack's SMOKE run).
set -uo pipefail
[[ $# -eq 1 && -n $1 ]] || { echo "usage: bash experiments/gpu/one_call.sh ARCHIVE_DIR" >&2; exit 2; }
ARCHIVE_DIR=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
for name in CALL_S BENCH_S MORE_STEPS; do
  [[ -z ${!name:-} || ${!name} =~ ^[0-9]{1,5}$ ]] || { echo "one_call: $name must be a whole number of seconds" >&2; exit 2; }
done
CALL_S=${CALL_S:-570} BENCH_S=${BENCH_S:-150} PACK=${PACK:-inan_table1} SMOKE=${SMOKE:-0}
PYTHON=${PYTHON:-python3}  # the interpreter that has torch
[[ -f experiments/gpu/$PACK.sh ]] || { echo "one_call: no pack experiments/gpu/$PACK.sh" >&2; exit 2; }
START=$SECONDS
WORK=${WORK:-/tmp/one_call}
mkdir -p "$WORK" || exit 2
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TARGETLM_DATA=${TARGETLM_DATA:-$PWD/.gpu_data}
if ! command -v targetlm > /dev/null; then
  mkdir -p "$WORK/bin"
  printf '#!/bin/sh\nexec %s -m targetlm "$@"\n' "$(command -v "$PYTHON")" > "$WORK/bin/targetlm"
  chmod +x "$WORK/bin/targetlm"
  export PATH=$WORK/bin:$PATH
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2> /dev/null
  "$PYTHON" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  command -v nvidia-cuda-mps-control > /dev/null && echo "MPS: nvidia-cuda-mps-control found" || echo "MPS: not found"
} 2>&1 | tee "$WORK/machine.txt"

# 1. the step benchmark (stopped at BENCH_S; what it printed is kept either way)
if [[ $BENCH_S == 0 ]]; then
  bench=()
elif [[ $SMOKE == 1 ]]; then
  bench=(--quick --seconds 1)
else
  bench=(--device cuda --modes off,graphs --seconds 5
    --presets "${BENCH_PRESETS:-inan-small-ptb-real,tf-small-ptb-wdr-n4}")
fi
if [[ ${#bench[@]} -gt 0 ]]; then
  TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-8} timeout "$BENCH_S" \
    "$PYTHON" benchmarks/gpu_step.py "${bench[@]}" --json-out "$WORK/gpu_step.json" 2>&1 \
    | grep -v -E '^(W|V|I)[0-9]{4} ' | tee "$WORK/gpu_step.txt" | tail -n 8
  if [[ $SMOKE != 1 ]]; then  # the chunked logits against the full ones (loss_impl "auto" on a GPU)
    timeout 40 "$PYTHON" benchmarks/gpu_step.py --device cuda --modes off --seconds 5 \
      --presets tf-small-ptb-wdr-n4 --set 'train.loss_impl="chunked"' \
      --json-out "$WORK/gpu_step_chunked.json" 2>&1 | grep -v -E '^(W|V|I)[0-9]{4} ' \
      | tee -a "$WORK/gpu_step.txt" | tail -n 3
  fi
  echo "one_call: benchmark done at $((SECONDS - START))s"
fi
touch "$WORK/gpu_step.txt"

# a second call: every run's cap raised by MORE_STEPS (the same for every arm)
plan=$WORK/$PACK/plan.tsv
if [[ -n ${MORE_STEPS:-} && -f $plan ]]; then
  awk -F'\t' -v OFS='\t' -v m="$MORE_STEPS" 'NR > 1 { $3 += m } 1' "$plan" > "$plan.tmp" && mv "$plan.tmp" "$plan"
  echo "one_call: caps raised by $MORE_STEPS steps"
fi

# 2. the pack, in the time left (its own budget keeps 25 s for the archive)
left=$((CALL_S - (SECONDS - START) - 25))
[[ $left -gt 60 ]] || { echo "one_call: no time left for the pack" >&2; left=0; }
if [[ $left -gt 0 ]]; then
  BUDGET_S=$left bash "experiments/gpu/$PACK.sh" "$WORK/$PACK" 2>&1 | tee "$WORK/pack.log"
fi

# 3. one archive: the benchmark, the pack's records, logs and plan (no checkpoints)
cp "$WORK/$PACK/plan.tsv" "$WORK/$PACK/records/" 2> /dev/null
kept=()
for path in machine.txt gpu_step.txt gpu_step.json gpu_step_chunked.json pack.log "$PACK/records" \
  "$PACK/logs"; do
  [[ -e $WORK/$path ]] && kept+=("$path")
done
tar -czf "$ARCHIVE_DIR/records.tar.gz" -C "$WORK" "${kept[@]}"
ls -l "$ARCHIVE_DIR/records.tar.gz"
echo "one_call: done in $((SECONDS - START))s"
