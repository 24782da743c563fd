# Shared by the GPU packs (experiments/gpu/<table>.sh OUT_DIR): every run of one paper table
# side by side on one GPU, sized to a time budget, evaluated, and its records copied out.
#
# Sizing (BUDGET_MIN, default 25 minutes for the whole pack, evaluation included): a probe starts
# every run side by side with its real settings and reads each run's metrics.jsonl (a training
# line every 10 steps) for PROBE_S seconds (default 60) after all of them have logged once; that
# gives each run's step rate with all the others beside it. The probes are then stopped and
# their directories deleted, and every real run gets the same train.max_steps (the same budget
# for every arm): the slowest run's rate x the time left (budget - time spent - EVAL_RESERVE_S for
# the final evaluation) x SAFETY (default 0.85: start-up and the per-epoch validation, which the
# probe does not see). A run still stops earlier at its preset's epochs or stopping rule. When the
# runs reach the cap with time left, further rounds raise it (plan_and_train). The cap is printed
# and kept in OUT_DIR/plan.tsv, so a second call resumes the same plan (every run with a last.pt
# is resumed; a finished one returns at once). A run that stops at the cap inside an epoch is
# evaluated at its best validated checkpoint (presets validate once per epoch).
#
# The runs are separate processes on one GPU: without NVIDIA's Multi-Process Service their
# kernels take turns, time-sliced (12 Inan LSTMs side by side ran at 11 steps/s each, about half
# of one alone). gpu_init starts the MPS daemon where nvidia-cuda-mps-control exists (MPS=0: not),
# and the same 12 then ran each at the rate of one alone (15.2k tokens/s on an H200).
#
# SET="key=value ...": --set overrides for every run of the pack, probes included (values without
# spaces), e.g. SET='train.precision="bf16"'.
#
# SMOKE=1: the wiring only, on the CPU: no probe, train.max_steps=1, a tiny slice of every split
# (SMOKE_SETS, set by each pack), evaluation on the same slices.
#
# Layout: OUT_DIR/runs/NAME (the run directories, checkpoints included), OUT_DIR/logs/NAME.txt
# (appended to by every call and round),
# OUT_DIR/records/NAME (config.toml, results.json, metrics.jsonl, eval-*.json, translate-*.json:
# no checkpoints), the input of `targetlm compare OUT_DIR/records`.
#
# A pack sets PACK and calls: gpu_init "$@"; add_run NAME CONFIG [key=value ...] (once per run);
# plan_and_train; evaluate_all FUNCTION (FUNCTION NAME evaluates one run, e.g. with eval_lm NAME
# [EVAL_ARGS ...]); save_records.

set -uo pipefail

gpu_init() {
  [[ $# -eq 1 && -n $1 ]] || { echo "usage: bash experiments/gpu/$PACK.sh OUT_DIR" >&2; exit 2; }
  OUT_DIR=$(realpath -m -- "$1") || exit 2  # a relative OUT_DIR is the caller's, not the repo's
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
  : "${TARGETLM_DATA:?set TARGETLM_DATA to the directory holding ptb/, wikitext-2/, multi30k/}"
  command -v targetlm > /dev/null || { echo "targetlm is not on PATH (bash scripts/setup.sh)" >&2; exit 2; }
  SMOKE=${SMOKE:-0}
  local name
  for name in BUDGET_MIN BUDGET_S PROBE_S EVAL_RESERVE_S; do  # whole numbers, before any arithmetic
    [[ -z ${!name:-} || ${!name} =~ ^[0-9]{1,6}$ ]] \
      || { echo "$PACK: $name must be a whole number of minutes or seconds, got '${!name}'" >&2; exit 2; }
  done
  # lists the packs split into words: whole numbers (seeds) and λs, nothing a shell would expand
  [[ -z ${SEEDS:-} || $SEEDS =~ ^[[:space:]]*[0-9]{1,9}([[:space:]]+[0-9]{1,9})*[[:space:]]*$ ]] \
    || { echo "$PACK: SEEDS must be whole numbers separated by spaces, got '$SEEDS'" >&2; exit 2; }
  [[ -z ${LAMBDAS:-} || $LAMBDAS =~ ^[[:space:]]*(0|1|0?\.[0-9]+)([[:space:]]+(0|1|0?\.[0-9]+))*[[:space:]]*$ ]] \
    || { echo "$PACK: LAMBDAS must be numbers in [0, 1] separated by spaces, got '$LAMBDAS'" >&2; exit 2; }
  BUDGET_S=${BUDGET_S:-$(( ${BUDGET_MIN:-25} * 60 ))}
  PROBE_S=${PROBE_S:-60}
  EVAL_RESERVE_S=${EVAL_RESERVE_S:-180}
  SAFETY=${SAFETY:-0.85}
  if [[ $SMOKE == 1 ]]; then DEVICE=cpu; else DEVICE=${DEVICE:-cuda}; fi
  # the fast step (train.compile, src/targetlm/training/compile.py): CUDA graphs on a GPU
  if [[ $DEVICE == cuda* ]]; then COMPILE=${COMPILE:-graphs}; else COMPILE=${COMPILE:-off}; fi
  [[ $COMPILE =~ ^(off|default|graphs)$ ]] || { echo "$PACK: COMPILE must be off, default or graphs" >&2; exit 2; }
  # one compile thread a run: the runs compile side by side (inductor's default is a pool of
  # as many workers as cores, in every run)
  export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}
  START_S=$SECONDS
  mkdir -p "$OUT_DIR/runs" "$OUT_DIR/logs" "$OUT_DIR/records" || exit 2
  OUT_DIR=$(cd "$OUT_DIR" && pwd)
  export OMP_NUM_THREADS=1
  # stopped (Ctrl-C, a time limit): stop the runs this pack started too, with their children
  # (evaluate_all's subshells run `targetlm eval` / `translate` as children of their own)
  trap '_stop_tree $(jobs -p); exit 130' INT TERM
  if [[ $DEVICE == cuda* && ${MPS:-1} == 1 ]] && command -v nvidia-cuda-mps-control > /dev/null; then
    if nvidia-cuda-mps-control -d 2> /dev/null; then
      trap 'echo quit | nvidia-cuda-mps-control' EXIT
      echo "$PACK: NVIDIA MPS started (the runs' kernels share the GPU instead of taking turns)"
    else
      echo "$PACK: NVIDIA MPS did not start (already running, or not allowed); runs are time-sliced"
    fi
  fi
  RUN_NAMES=() RUN_CONFIGS=() RUN_SETS=()
  echo "$PACK: records in $OUT_DIR/records; device $DEVICE; train.compile $COMPILE; budget ${BUDGET_S}s$([[ $SMOKE == 1 ]] && echo ' (SMOKE: one step each)')"
}

# _stop_tree PID ...: SIGTERM to each process and all its descendants (children first found,
# then signalled from the top, so none is reparented away before it is found)
_stop_tree() {
  local pid all=() queue=("$@")
  while [[ ${#queue[@]} -gt 0 ]]; do
    pid=${queue[0]} queue=("${queue[@]:1}")
    all+=("$pid")
    mapfile -t -O "${#queue[@]}" queue < <(pgrep -P "$pid" 2> /dev/null)
  done
  [[ ${#all[@]} -gt 0 ]] && kill "${all[@]}" 2> /dev/null
  return 0
}

# add_run NAME CONFIG [key=value ...]: one run of the table (values without spaces)
add_run() {
  local name=$1 config=$2
  shift 2
  [[ -f $config ]] || { echo "$PACK: no such preset: $config" >&2; exit 2; }
  RUN_NAMES+=("$name") RUN_CONFIGS+=("$config") RUN_SETS+=("$*")
}

# the --set arguments of run I: the device, its own settings, the smoke slices, then any given
_train_args() {
  local i=$1 kv sets every_run smoke_sets=()
  shift
  local args=(--set train.device="\"$DEVICE\"" --set train.threads=1 --set train.progress=false
    --set train.compile="\"$COMPILE\"")
  read -ra sets <<< "${RUN_SETS[$i]}"
  read -ra every_run <<< "${SET:-}"
  [[ $SMOKE == 1 ]] && read -ra smoke_sets -d '' <<< "${SMOKE_SETS:-}"
  for kv in "${sets[@]}" "${every_run[@]}" "${smoke_sets[@]}" "$@"; do args+=(--set "$kv"); done
  printf '%s\0' "${args[@]}"
}

_probe() {  # sets STEPS[i] from each run's measured step rate
  local i name dir probe_pids=() first=() first_t=() last=() last_t=() waited=0 started=-1
  local launched=$SECONDS
  echo "$PACK: probing the step rate of ${#RUN_NAMES[@]} runs side by side (${PROBE_S}s)"
  for i in "${!RUN_NAMES[@]}"; do
    dir=$OUT_DIR/probe/${RUN_NAMES[$i]}
    rm -rf "$dir"
    mapfile -d '' args < <(_train_args "$i" train.log_every=10)
    targetlm train "${RUN_CONFIGS[$i]}" --run-dir "$dir" "${args[@]}" \
      > "$OUT_DIR/logs/probe-${RUN_NAMES[$i]}.txt" 2>&1 &
    probe_pids+=($!)
  done
  while :; do
    sleep 5
    waited=$((waited + 5))
    local logged=0 now=$SECONDS
    for i in "${!RUN_NAMES[@]}"; do
      local step
      step=$(grep '"kind": "train"' "$OUT_DIR/probe/${RUN_NAMES[$i]}/metrics.jsonl" 2> /dev/null \
        | tail -n 1 | sed -E 's/.*"step": ([0-9]+).*/\1/')
      [[ -n $step ]] || continue
      logged=$((logged + 1))
      [[ -n ${first[$i]:-} ]] || { first[$i]=$step first_t[$i]=$now; }
      last[$i]=$step last_t[$i]=$now
    done
    if [[ $logged -eq ${#RUN_NAMES[@]} && $started -lt 0 ]]; then started=$SECONDS; fi
    [[ $started -ge 0 && $((SECONDS - started)) -ge $PROBE_S ]] && break
    if [[ $waited -ge $((PROBE_S + 300)) ]]; then
      echo "$PACK: a probe logged no training step within $((PROBE_S + 300))s (logs: $OUT_DIR/logs/probe-*)" >&2
      kill "${probe_pids[@]}" 2> /dev/null; wait; exit 1
    fi
  done
  kill "${probe_pids[@]}" 2> /dev/null
  wait "${probe_pids[@]}" 2> /dev/null
  rm -rf "$OUT_DIR/probe"
  local left=$((BUDGET_S - (SECONDS - START_S) - EVAL_RESERVE_S))
  [[ $left -gt 0 ]] || { echo "$PACK: no time left after the probe (BUDGET_MIN too small)" >&2; exit 1; }
  local rates=() cap
  for i in "${!RUN_NAMES[@]}"; do
    local dt=$((last_t[$i] - first_t[$i])) ds=$((last[$i] - first[$i]))
    # a run that logged once: its steps over the whole probe, start-up included (a lower bound)
    [[ $dt -gt 0 && $ds -gt 0 ]] || dt=$((last_t[$i] - launched)) ds=${last[$i]}
    rates[$i]=$(awk -v s="$ds" -v t="$dt" 'BEGIN { printf "%.2f", s / t }')
  done
  # the same budget for every arm: the slowest run's steps in the time left
  cap=$(printf '%s\n' "${rates[@]}" | sort -g | head -n 1 \
    | awk -v l="$left" -v f="$SAFETY" '{ c = int($1 * l * f); print (c < 1 ? 1 : c) }')
  printf 'name\tsteps_per_s\tmax_steps\n' > "$OUT_DIR/plan.tsv"
  for i in "${!RUN_NAMES[@]}"; do
    STEPS[$i]=$cap
    printf '%s\t%s\t%s\n' "${RUN_NAMES[$i]}" "${rates[$i]}" "$cap" >> "$OUT_DIR/plan.tsv"
    echo "$PACK: ${RUN_NAMES[$i]}: ${rates[$i]} steps/s beside the others"
  done
  echo "$PACK: every run: train.max_steps=$cap (the slowest rate x ${left}s left x $SAFETY)"
}

# plan_and_train: size every run (SMOKE: 1 step; a previous plan.tsv: its caps) and train all
# side by side, in rounds: when the runs reach the cap sooner than planned (the probe, measured
# while 20-odd processes start, reads slow), the time left goes to another round that resumes
# every run from its last.pt under a higher cap, the same for every arm (EXTEND=0: one round).
# A run that stopped by its own rule (epochs, patience) returns at once when resumed. Exits
# non-zero, naming the runs, if any failed.
plan_and_train() {
  local i round=1
  STEPS=()
  if [[ $SMOKE == 1 ]]; then
    for i in "${!RUN_NAMES[@]}"; do STEPS[$i]=1; done
  elif [[ -f $OUT_DIR/plan.tsv ]]; then
    echo "$PACK: reusing the caps of $OUT_DIR/plan.tsv"
    for i in "${!RUN_NAMES[@]}"; do
      STEPS[$i]=$(awk -F'\t' -v n="${RUN_NAMES[$i]}" '$1 == n { print $3 }' "$OUT_DIR/plan.tsv")
      [[ -n ${STEPS[$i]} ]] || { echo "$PACK: ${RUN_NAMES[$i]} is not in $OUT_DIR/plan.tsv" >&2; exit 1; }
    done
  else
    _probe
  fi
  while :; do
    local round_start=$SECONDS
    _train_round "$round"
    [[ $SMOKE == 1 || ${EXTEND:-1} == 0 ]] && break
    _extend "$round" "$((SECONDS - round_start))" || break
    round=$((round + 1))
  done
  echo "$PACK: trained ${#RUN_NAMES[@]} runs in $((SECONDS - START_S))s"
}

# _train_round ROUND: every run to its cap, side by side: a run with a last.pt resumes from it
# (a finished run returns at once), any other starts; each log gets a "== round ROUND" header
_train_round() {
  local round=$1 i name pids=() names=() failed=0
  ROUND_LOG_LINE=()  # where this round's part of each log starts (logs are appended to)
  for i in "${!RUN_NAMES[@]}"; do
    name=${RUN_NAMES[$i]}
    local dir=$OUT_DIR/runs/$name resume=()
    [[ -f $dir/last.pt ]] && resume=(--resume)
    mapfile -d '' args < <(_train_args "$i" train.max_steps="${STEPS[$i]}")
    echo "== round $round: train.max_steps=${STEPS[$i]}" >> "$OUT_DIR/logs/$name.txt"
    ROUND_LOG_LINE[$i]=$(wc -l < "$OUT_DIR/logs/$name.txt")
    targetlm train "${RUN_CONFIGS[$i]}" --run-dir "$dir" "${resume[@]}" "${args[@]}" \
      >> "$OUT_DIR/logs/$name.txt" 2>&1 &
    pids+=($!) names+=("$name")
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      echo "$PACK: training failed: ${names[$i]} (log: $OUT_DIR/logs/${names[$i]}.txt)" >&2
      failed=1
    fi
  done
  [[ $failed == 0 ]] || exit 1
}

# _extend ROUND SECONDS: after a round that took SECONDS, if runs stopped at the cap, raise every
# run's cap by the steps the round's pace fits into the time left (x SAFETY) and rewrite
# plan.tsv; fails (no more rounds) when no run trained up to the cap in this round or the gain
# is under a tenth. The pace: the fewest steps a capped run made in the round over the round's
# time, start-up included, so no faster than the slowest run's
_extend() {
  local round=$1 took=$2 i fewest=-1
  for i in "${!RUN_NAMES[@]}"; do
    local log from
    log=$(tail -n "+$((ROUND_LOG_LINE[$i] + 1))" "$OUT_DIR/logs/${RUN_NAMES[$i]}.txt")
    grep -q "^stopped at max_steps=" <<< "$log" || continue
    # where the round started it: the trainer's "resumed RUN_DIR at epoch E, step S", else 0
    from=$(sed -nE 's/^resumed .* step ([0-9]+)$/\1/p' <<< "$log" | tail -n 1)
    local made=$((STEPS[$i] - ${from:-0}))
    [[ $made -gt 0 ]] || continue  # already at the cap (killed before its results)
    [[ $fewest -lt 0 || $made -lt $fewest ]] && fewest=$made
  done
  [[ $fewest -gt 0 ]] || return 1
  local left=$((BUDGET_S - (SECONDS - START_S) - EVAL_RESERVE_S)) more
  [[ $left -gt 0 ]] || return 1
  # took + 1: SECONDS counts whole seconds, so a round took up to a second more than it says
  more=$(awk -v s="$fewest" -v t="$((took + 1))" -v l="$left" -v f="$SAFETY" 'BEGIN { print int(s / t * l * f) }')
  if [[ $more -lt $((STEPS[0] / 10)) || $more -lt 1 ]]; then
    echo "$PACK: round $round ended at the cap with ${left}s left: $more more steps would not pay for another round"
    return 1
  fi
  for i in "${!RUN_NAMES[@]}"; do STEPS[$i]=$((STEPS[$i] + more)); done
  awk -F'\t' -v OFS='\t' -v m="$more" 'NR > 1 { $3 += m } 1' "$OUT_DIR/plan.tsv" > "$OUT_DIR/plan.tsv.tmp" \
    && mv "$OUT_DIR/plan.tsv.tmp" "$OUT_DIR/plan.tsv"
  echo "$PACK: round $round reached the cap in ${took}s with ${left}s left: every run resumes to train.max_steps=${STEPS[0]}"
}

# eval_lm NAME [EVAL_ARGS ...]: eval-valid.json and eval-test.json of a language-model run, on
# all of valid and test (SMOKE: the slices), each written whole or not at all
eval_lm() {
  local name=$1 split dir=$OUT_DIR/runs/$1
  shift
  local slices=(--set 'data.valid="valid"' --set 'data.test="test"')
  [[ $SMOKE == 1 ]] && slices=()
  for split in valid test; do
    [[ $dir/eval-$split.json -nt $dir/best.pt ]] && continue  # kept unless trained since
    targetlm eval "$dir" --split "$split" "${slices[@]}" "$@" --json \
      > "$dir/eval-$split.json.tmp" 2>> "$OUT_DIR/logs/$name.txt" \
      && mv "$dir/eval-$split.json.tmp" "$dir/eval-$split.json" \
      || { echo "$PACK: evaluation failed: $name $split (log: $OUT_DIR/logs/$name.txt)" >&2; exit 1; }
  done
}

# evaluate_all FUNCTION: FUNCTION NAME for every run, all side by side (one process per run, as
# in training); exits non-zero if any failed
evaluate_all() {
  local function=$1 i pids=() failed=0
  for i in "${!RUN_NAMES[@]}"; do
    "$function" "${RUN_NAMES[$i]}" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
  [[ $failed == 0 ]] || exit 1
  echo "$PACK: evaluated ${#RUN_NAMES[@]} runs ($((SECONDS - START_S))s in all)"
}

# save_records: the small files of every run (no checkpoints) into OUT_DIR/records/NAME
save_records() {
  local name file
  for name in "${RUN_NAMES[@]}"; do
    mkdir -p "$OUT_DIR/records/$name"
    rm -f "$OUT_DIR/records/$name"/{eval,translate}-*.json  # an earlier call's, maybe stale
    for file in "$OUT_DIR/runs/$name"/{config.toml,results.json,metrics.jsonl,eval-*.json,translate-*.json}; do
      [[ -f $file ]] && cp "$file" "$OUT_DIR/records/$name/"
    done
  done
  echo "$PACK: done in $((SECONDS - START_S))s; the table: targetlm compare $OUT_DIR/records ${COMPARE_ARGS:-}"
}
