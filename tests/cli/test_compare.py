"""``targetlm compare``: fake run directories in tmp_path (config.toml written by the project's
config writer, results.json, eval-*.json, translate-*.json, metrics.jsonl) checked against
hand computations, every bad input as one error line, the committed diffusion records
against the numbers of docs/history.md's text-diffusion table, and every history.md table that
sits under a ``targetlm compare docs/records/...`` command against what that command prints."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from targetlm import compare
from targetlm import config as config_lib
from targetlm.cli import main

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "docs" / "records"


def make_run(
    root: Path,
    name: str,
    *,
    seed: int,
    config: dict | None = None,
    results: dict | None = None,
    eval_valid: dict | None = None,
    eval_test: dict | None = None,
    translate: dict[str, dict] | None = None,
    valid_log: list[tuple[int, int, float]] = (),
) -> Path:
    """A finished run directory: ``valid_log`` is (step, epoch, valid ppl) lines of
    metrics.jsonl; ``translate`` maps file names to translate summaries."""
    run = root / name
    run.mkdir(parents=True)
    data = json.loads(json.dumps(config or {}))
    data.setdefault("train", {})["seed"] = seed
    (run / "config.toml").write_text(config_lib.dumps(config_lib.from_dict(data)))
    if results is not None:
        (run / "results.json").write_text(json.dumps(results))
    for split, result in (("valid", eval_valid), ("test", eval_test)):
        if result is not None:
            (run / f"eval-{split}.json").write_text(json.dumps(result))
    for file_name, summary in (translate or {}).items():
        (run / file_name).write_text(json.dumps(summary))
    lines = [{"kind": "train", "step": 1, "epoch": 1, "loss": 5.0, "tok_s": 100.0}]
    lines += [{"kind": "valid", "step": s, "epoch": e, "ppl": p} for s, e, p in valid_log]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def lm_results(valid: float, test: float, params: int = 1000) -> dict:
    return {"valid": {"ppl": valid}, "test": {"ppl": test}, "total_params": params}


def lm_eval(ppl: float, ensemble: dict[float, float] | None = None) -> dict:
    result = {"ppl": ppl, "tokens": 100}
    if ensemble is not None:
        result["ensemble"] = [{"lambda": lam, "ppl": p} for lam, p in ensemble.items()]
    return result


def rows_of(*dirs: str | Path, **options) -> list[compare.Row]:
    runs, _ = compare.discover([str(d) for d in dirs])
    return compare.build_rows(
        compare.group_runs(runs, options.pop("group_by", "preset")), **options
    )


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["compare", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_runs_differing_only_in_seed_form_one_group_with_mean_and_sample_sd(tmp_path):
    for seed, test_ppl, threads in ((1, 100.0, 1), (2, 110.0, 2), (3, 120.0, 1)):
        make_run(
            tmp_path, f"base-s{seed}", seed=seed,
            config={"train": {"threads": threads, "lr": 0.5}},  # threads: cosmetic
            results=lm_results(valid=999.0, test=999.0),  # eval-*.json take precedence
            eval_valid=lm_eval(test_ppl - 5), eval_test=lm_eval(test_ppl),
            valid_log=[(10, 1, 130.0), (20, 2, 120.0 + seed), (30, 3, 125.0)],
        )  # fmt: skip
    make_run(
        tmp_path, "other-s1", seed=1, config={"train": {"lr": 0.1}}, results=lm_results(50, 60)
    )
    (base, other) = rows_of(tmp_path)
    assert base.group.name == "base" and [r.seed for r in base.group.runs] == [1, 2, 3]
    assert base.test.values == [100.0, 110.0, 120.0]
    assert base.test.mean == pytest.approx(110.0)
    # sample sd (n - 1): sqrt(((-10)² + 0² + 10²) / 2) = 10
    assert base.test.sd == pytest.approx(10.0)
    assert base.valid.mean == pytest.approx(105.0)
    assert [run.epochs for run in base.group.runs] == [(2, 3)] * 3
    assert other.test.values == [60.0] and other.test.sd is None
    assert other.test.text() == "60.00"


def test_lambda_chosen_on_valid_is_read_on_test_per_run(tmp_path):
    # s1: best on valid is λ 0.2 (test at 0.4 would be better: it must not be picked)
    make_run(
        tmp_path, "sim-s1", seed=1, results=lm_results(0, 0),
        eval_valid=lm_eval(50.0, {0.0: 50.0, 0.2: 45.0, 0.4: 47.0}),
        eval_test=lm_eval(52.0, {0.0: 52.0, 0.2: 48.0, 0.4: 40.0}),
    )  # fmt: skip
    make_run(
        tmp_path, "sim-s2", seed=2, results=lm_results(0, 0),
        eval_valid=lm_eval(51.0, {0.0: 51.0, 0.2: 49.0, 0.4: 44.0}),
        eval_test=lm_eval(53.0, {0.0: 53.0, 0.2: 47.0, 0.4: 46.0}),
    )  # fmt: skip
    make_run(
        tmp_path, "base-s1", seed=1, results=lm_results(0, 0),
        eval_valid=lm_eval(60.0), eval_test=lm_eval(61.0),
    )  # fmt: skip
    (base, sim) = sorted(rows_of(tmp_path, lambda_on="valid"), key=lambda r: r.group.name)
    assert sim.lambdas == [0.2, 0.4]
    assert sim.test.values == [48.0, 46.0]
    assert sim.test_alone.values == [52.0, 53.0]
    assert base.lambdas == [None] and base.test.values == [61.0]  # no heads: λ does not apply
    fixed = {r.group.name: r for r in rows_of(tmp_path, fixed_lambda=0.4)}["sim"]
    assert fixed.test.values == [40.0, 46.0]
    assert compare._lambda_text(sim.lambdas) == "0.2 (0.2, 0.4)"


def test_translation_lambda_chosen_by_the_highest_valid_bleu(tmp_path):
    summary = {"bleu": 0.0, "chrf": 0.0}
    make_run(
        tmp_path, "de-en-wdr-s1", seed=1,
        results={"valid": {"bleu": 20.0}, "test": {"bleu": 21.0, "chrf": 50.0}},
        translate={
            "translate-val-lambda0.1.json": summary | {"bleu": 22.0},
            "translate-val-lambda0.3.json": summary | {"bleu": 23.0},
            "translate-test-lambda0.3.json": summary | {"bleu": 24.5, "chrf": 51.0},
        },
    )  # fmt: skip
    (row,) = rows_of(tmp_path, metric="bleu", lambda_on="valid")
    assert row.decoding == "" and row.lambdas == [0.3]
    assert row.test.values == [24.5] and row.test_alone.values == [21.0]


def test_a_classifiers_accuracy_and_macro_f1_higher_is_better_with_four_digits(tmp_path, capsys):
    def classifier(valid: float, test: float) -> dict:
        return {
            split: {"accuracy": a, "macro_f1": a / 2, "ppl": 9.0, "examples": 100}
            for split, a in (("valid", valid), ("test", test))
        }

    for seed, acc in ((1, 0.2408), (2, 0.2512)):
        make_run(tmp_path, f"wdr-s{seed}", seed=seed, results=classifier(acc - 0.01, acc))
    make_run(tmp_path, "base-s1", seed=1, results=classifier(0.23, 0.2400))
    make_run(tmp_path, "base-s2", seed=2, results=classifier(0.23, 0.2300))
    base, wdr = rows_of(tmp_path, metric="accuracy", baseline="base")
    assert wdr.test.values == [0.2408, 0.2512]
    assert wdr.difference.delta == pytest.approx((0.2408 + 0.2512 - 0.24 - 0.23) / 2)
    status, out, _ = run_cli(capsys, str(tmp_path), "--metric", "macro_f1", "--baseline", "base")
    assert status == 0
    assert "| valid macro_f1 | test macro_f1 |" in out
    assert "0.1230 ± 0.0037" in out  # (0.1204, 0.1256): four digits, not 0.12 ± 0.00


def test_student_t_quantile_matches_the_table():
    for df, expected in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert compare.student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert compare.student_t_cdf(0.0, 3.5) == pytest.approx(0.5)


def test_welch_interval_matches_a_hand_computation():
    # a: mean 2, s² 2, s²/n 1; b: mean 1, s²/n 1; se = √2, df = (1 + 1)² / (1/1 + 1/1) = 2
    difference = compare.welch_difference(compare.Spread([1.0, 3.0]), compare.Spread([0.0, 2.0]))
    assert difference.delta == pytest.approx(1.0)
    assert difference.df == pytest.approx(2.0)
    half = 4.302653 * math.sqrt(2)
    assert difference.low == pytest.approx(1.0 - half, abs=1e-5)
    assert difference.high == pytest.approx(1.0 + half, abs=1e-5)
    # unequal: a s²/n = 4/3 (n 3), b s²/n = 0.25 (n 2); df = (19/12)² / ((4/3)²/2 + 0.25²/1)
    unequal = compare.welch_difference(
        compare.Spread([10.0, 12.0, 14.0]), compare.Spread([8.0, 9.0])
    )
    assert unequal.df == pytest.approx((19 / 12) ** 2 / ((4 / 3) ** 2 / 2 + 0.0625))
    one_seed = compare.welch_difference(compare.Spread([5.0]), compare.Spread([1.0, 2.0]))
    assert one_seed.delta == pytest.approx(3.5) and one_seed.low is None
    assert "n < 2" in one_seed.text()


def test_baseline_difference_in_every_format(tmp_path, capsys):
    for seed, (base, heads) in enumerate(((100.0, 96.0), (102.0, 94.0)), start=1):
        make_run(tmp_path, f"base-s{seed}", seed=seed, results=lm_results(base, base))
        make_run(
            tmp_path, f"wdr-s{seed}", seed=seed, config={"model": {"heads": {"kind": "wdr"}}},
            results=lm_results(heads, heads),
        )  # fmt: skip
    status, out, err = run_cli(capsys, str(tmp_path), "--baseline", "base")
    assert status == 0 and err == ""
    table = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()}
    assert "Δ vs base [95% CI]" in table["group"]
    # Δ = 95 - 101 = -6; both sds √2: se = √2, df = 2
    half = 4.302653 * math.sqrt(2)
    assert f"-6.00 [{-6 - half:+.2f}, {-6 + half:+.2f}]" in table["wdr"]
    assert "101.00 ± 1.41" in table["base"] and "baseline" in table["base"]

    status, out, _ = run_cli(capsys, str(tmp_path), "--baseline", "base", "--format", "csv")
    by_group = {r["group"]: r for r in csv.DictReader(io.StringIO(out))}
    assert float(by_group["wdr"]["delta"]) == pytest.approx(-6.0)
    assert float(by_group["wdr"]["delta_low"]) == pytest.approx(-6.0 - half, abs=1e-5)
    assert by_group["base"]["seeds"] == "1 2" and by_group["base"]["test_sd"] != ""

    status, out, _ = run_cli(capsys, str(tmp_path), "--baseline", "base", "--format", "json")
    rows = {r["group"]: r for r in json.loads(out)["rows"]}
    assert rows["wdr"]["test"]["values"] == [96.0, 94.0]
    assert rows["wdr"]["difference"]["df"] == pytest.approx(2.0)


def test_paired_difference_matches_a_hand_computation():
    group = {1: 10.0, 2: 12.0, 3: 15.0}
    baseline = {1: 9.0, 2: 10.0, 3: 12.0, 4: 100.0}  # seed 4 has no pair: left out
    difference = compare.paired_difference(group, baseline)
    # differences 1, 2, 3: mean 2, sd 1, df 2, half-width t(0.975, 2) · 1 / √3
    half = 4.302653 / math.sqrt(3)
    assert difference.pairs == [1, 2, 3] and difference.df == 2
    assert difference.delta == pytest.approx(2.0)
    assert (difference.low, difference.high) == pytest.approx((2 - half, 2 + half), abs=1e-5)
    one = compare.paired_difference({2: 5.0, 7: 1.0}, {2: 3.0})
    assert (one.delta, one.low, one.pairs) == (2.0, None, [2])
    with pytest.raises(ValueError, match="no seed in common"):
        compare.paired_difference({1: 1.0}, {2: 1.0})


def test_paired_baseline_narrows_what_a_shared_seed_effect_widens(tmp_path, capsys):
    # each seed shifts both groups alike (+0, +10, +20): Welch sees the spread, pairing removes it
    for seed in (1, 2, 3):
        shift = 10.0 * (seed - 1)
        make_run(tmp_path, f"base-s{seed}", seed=seed, results=lm_results(0, 100 + shift))
        make_run(
            tmp_path, f"wdr-s{seed}", seed=seed, config={"model": {"heads": {"kind": "wdr"}}},
            results=lm_results(0, 97 + shift + (seed == 3)),
        )  # fmt: skip
    for seed in (1, 2, 5):  # seed 5 has no base run: two pairs
        make_run(
            tmp_path, f"sim-s{seed}", seed=seed, config={"model": {"heads": {"kind": "simple"}}},
            results=lm_results(0, 101 + 10.0 * (seed - 1)),
        )  # fmt: skip
    (welch,) = [r for r in rows_of(tmp_path, baseline="base") if r.group.name == "wdr"]
    assert welch.difference.low < 0 < welch.difference.high and welch.difference.pairs is None
    status, out, err = run_cli(capsys, str(tmp_path), "--baseline", "base", "--paired")
    assert status == 0 and err == ""
    table = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()}
    # differences -3, -3, -2: mean -8/3, sd 1/√3, half t(0.975, 2) · (1/√3) / √3
    mean, half = -8 / 3, 4.302653 / 3
    assert f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]" in table["wdr"]
    assert "+1.00 [+1.00, +1.00] (2 pairs)" in table["sim"]  # differences 1, 1: no spread
    assert "paired t-interval" in out and "Welch" not in out
    status, out, _ = run_cli(
        capsys, str(tmp_path), "--baseline", "base", "--paired", "--format", "json"
    )
    rows = {r["group"]: r for r in json.loads(out)["rows"]}
    assert rows["sim"]["difference"]["paired_seeds"] == [1, 2]
    assert rows["wdr"]["difference"]["df"] == 2


def test_paired_needs_a_baseline_and_a_shared_seed(tmp_path, capsys):
    make_run(tmp_path, "base-s1", seed=1, results=lm_results(0, 100))
    make_run(
        tmp_path, "wdr-s2", seed=2, config={"model": {"heads": {"kind": "wdr"}}},
        results=lm_results(0, 90),
    )  # fmt: skip
    assert "--paired" in one_error_line(capsys, str(tmp_path), "--paired")
    err = one_error_line(capsys, str(tmp_path), "--baseline", "base", "--paired")
    assert "wdr (seeds 2) shares no seed with base (seeds 1)" in err


def test_group_by_label_and_labelled_presets(tmp_path):
    make_run(tmp_path / "a", "x-s1", seed=1, results=lm_results(10, 11))
    make_run(tmp_path / "a", "x-s2", seed=2, results=lm_results(10, 13))
    make_run(tmp_path / "b", "y-s1", seed=1, results=lm_results(10, 20))
    (first, second) = rows_of(f"one:{tmp_path / 'a'}", f"two:{tmp_path / 'b'}", group_by="label")
    assert (first.group.name, first.test.mean) == ("one", 12.0)
    assert (second.group.name, second.test.mean) == ("two", 20.0)
    names = [r.group.name for r in rows_of(f"one:{tmp_path}/a/x-*")]  # a glob behind a label
    assert names == ["one/x"]


def one_error_line(capsys, *argv: str) -> str:
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("targetlm: error: ")
    return err


def test_a_directory_that_is_not_a_run_is_one_error(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert "is not a run directory" in one_error_line(capsys, str(tmp_path / "empty"))
    assert "no such directory" in one_error_line(capsys, str(tmp_path / "missing"))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.toml").write_text("[train]\nseed = 1\n")
    assert "not a finished run" in one_error_line(capsys, str(unfinished))


def test_configs_differing_in_more_than_seed_are_listed(tmp_path, capsys):
    make_run(tmp_path, "base-s1", seed=1, config={"train": {"lr": 0.1}}, results=lm_results(1, 2))
    make_run(
        tmp_path, "base-s2", seed=2, config={"train": {"lr": 0.2, "epochs": 3}},
        results=lm_results(1, 2),
    )  # fmt: skip
    plot = tmp_path / "curves.png"
    err = one_error_line(capsys, str(tmp_path), "--plot", str(plot))
    assert "group 'base'" in err and "train.epochs" in err and "train.lr" in err
    assert "train.seed" not in err
    assert not plot.exists()  # nothing written on bad input


def test_a_metric_a_run_lacks_is_one_error(tmp_path, capsys):
    make_run(tmp_path, "base-s1", seed=1, results=lm_results(1, 2))
    err = one_error_line(capsys, str(tmp_path), "--metric", "bleu")
    assert "base-s1 has no test bleu" in err and "test ppl" in err
    make_run(
        tmp_path, "sim-s1", seed=1, results=lm_results(1, 2),
        eval_test=lm_eval(2.0, {0.0: 2.0, 0.3: 1.9}),
    )  # fmt: skip
    err = one_error_line(capsys, str(tmp_path / "sim-s1"), "--lambda-on", "valid")
    assert "has no valid ppl of its head ensemble" in err
    err = one_error_line(capsys, str(tmp_path / "sim-s1"), "--lambda", "0.5")
    assert "no test ppl at λ 0.5" in err and "λ 0, 0.3" in err
    err = one_error_line(capsys, str(tmp_path), "--baseline", "nothing")
    assert "--baseline: no group 'nothing'" in err


def test_unfinished_runs_inside_a_folder_are_skipped_and_named(tmp_path, capsys):
    make_run(tmp_path, "base-s1", seed=1, results=lm_results(1, 2))
    (tmp_path / "base-s2").mkdir()
    (tmp_path / "base-s2" / "config.toml").write_text("[train]\nseed = 2\n")
    status, out, err = run_cli(capsys, str(tmp_path))
    assert status == 0 and "| base | 1 |" in out
    assert "skipped unfinished runs" in err and "base-s2" in err


def test_plot_draws_learning_curves_and_the_lambda_sweep(tmp_path, capsys):
    for seed in (1, 2):
        make_run(
            tmp_path / "runs", f"sim-s{seed}", seed=seed, results=lm_results(0, 0),
            eval_valid=lm_eval(50.0, {0.0: 50.0, 0.2: 45.0 + seed}),
            eval_test=lm_eval(52.0, {0.0: 52.0, 0.2: 48.0}),
            valid_log=[(10, 1, 80.0 + seed), (20, 2, 60.0 + seed)],
        )  # fmt: skip
    image = tmp_path / "curves.png"
    status, _, _ = run_cli(
        capsys, str(tmp_path / "runs"), "--lambda-on", "valid", "--plot", str(image)
    )
    assert status == 0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_group_has_one_colour_in_both_panels(tmp_path, capsys, monkeypatch):
    # base draws a learning curve but no λ sweep: the heads group keeps its colour anyway
    for name in ("base-s1", "sim-s1"):
        lambdas = {} if name.startswith("base") else {0.0: 50.0, 0.2: 45.0}
        make_run(
            tmp_path / "runs", name, seed=1, results=lm_results(0, 0),
            eval_valid=lm_eval(50.0, lambdas), eval_test=lm_eval(52.0, lambdas),
            valid_log=[(10, 1, 80.0), (20, 2, 60.0)],
        )  # fmt: skip
    drawn = {}

    def keep(path, figure):
        for i, axis in enumerate(figure.axes):
            drawn[i] = {line.get_label(): line.get_color() for line in axis.lines}

    monkeypatch.setattr("targetlm.compare.write_figure", keep)
    status, _, err = run_cli(
        capsys, str(tmp_path / "runs"), "--lambda-on", "valid", "--plot", str(tmp_path / "c.png")
    )
    assert status == 0, err
    assert set(drawn[0]) == {"base", "sim"} and set(drawn[1]) == {"sim"}
    assert drawn[1]["sim"] == drawn[0]["sim"] != drawn[0]["base"]


# docs/history.md, "Base vs WDR vs WDR + the head ensemble": rows of the committed records as
# the collector script printed them: (label, direction, length, K) -> base, WDR λ 0, WDR λ 0.1
# (mean ± sd test BLEU over seeds), ensemble − base
DIFFUSION_TABLE = {
    ("cpu-12ep", "de-en", "predicted", 10): ("5.18 ± 0.26", "5.45 ± 0.55", "5.44 ± 0.34", 0.25),
    ("cpu-12ep", "de-en", "predicted", 20): ("5.29 ± 0.08", "5.85 ± 0.74", "5.80 ± 0.15", 0.51),
    ("cpu-12ep", "de-en", "oracle", 10): ("4.57 ± 0.71", "4.98 ± 0.18", "5.28 ± 0.59", 0.71),
    ("cpu-12ep", "de-en", "oracle", 20): ("4.89 ± 0.15", "5.47 ± 0.31", "5.41 ± 0.42", 0.52),
    ("gpu-48ep-8k", "en-de", "predicted", 20): ("6.45 ± 0.15", "6.84 ± 0.20", "7.32 ± 0.18", 0.87),
    ("gpu-48ep-8k", "en-de", "oracle", 10): ("5.62 ± 0.31", "5.90 ± 0.23", "6.39 ± 0.08", 0.77),
}


@pytest.mark.parametrize(("label", "direction"), [("cpu-12ep", "de-en"), ("gpu-48ep-8k", "en-de")])
def test_committed_diffusion_records_reproduce_the_results_table(capsys, label, direction):
    folder = RECORDS / f"diffusion-{label}"
    status, out, err = run_cli(
        capsys, f"{label}:{folder}/{direction}-*", "--metric", "bleu", "--lambda", "0.1",
        "--baseline", f"{direction}-base", "--format", "json",
    )  # fmt: skip
    assert status == 0, err
    rows = {(r["group"], r["decoding"]): r for r in json.loads(out)["rows"]}
    checked = 0
    for (row_label, row_direction, length, k), expected in DIFFUSION_TABLE.items():
        if (row_label, row_direction) != (label, direction):
            continue
        decoding = f"k{k}-{length}"
        base = rows[(f"{label}/{direction}-base", decoding)]
        wdr = rows[(f"{label}/{direction}-wdr", decoding)]

        def shown(spread: dict) -> str:
            return f"{spread['mean']:.2f} ± {spread['sd']:.2f}"

        assert (shown(base["test"]), shown(wdr["test_alone"]), shown(wdr["test"])) == expected[:3]
        assert wdr["lambdas"] == [0.1] * len(wdr["seeds"])
        assert set(base["lambdas"]) == {None}  # no heads: its model alone
        assert round(wdr["difference"]["delta"], 2) == pytest.approx(expected[3])
        checked += 1
    assert checked >= 2


# docs/history.md, "Heo et al. Table 1, the larger CPU regime": WDR − Sim paired by seed at
# λ 0.2 (mean, paired interval) from the committed records
HEO_PAIRED = {"sim-n2": ("wdr-n2", -0.91, -1.22, -0.60), "sim-n4": ("wdr-n4", -1.28, -2.55, -0.00)}


@pytest.mark.parametrize("baseline", sorted(HEO_PAIRED))
def test_committed_heo_records_reproduce_the_paired_table(capsys, baseline):
    status, out, err = run_cli(
        capsys, str(RECORDS / "heo-tf-ptb-large"), "--lambda", "0.2", "--baseline", baseline,
        "--paired", "--format", "json",
    )  # fmt: skip
    assert status == 0, err
    group, delta, low, high = HEO_PAIRED[baseline]
    (row,) = [r for r in json.loads(out)["rows"] if r["group"] == group]
    shown = [round(row["difference"][key], 2) for key in ("delta", "low", "high")]
    assert shown == pytest.approx([delta, low, high])
    assert row["difference"]["paired_seeds"] == [1, 2, 3]


REPRODUCTIONS = REPO / "docs" / "reproductions"


def printed_tables(
    path: Path = REPO / "docs" / "history.md", pattern: str = r"docs/records/.*"
) -> list[tuple[int, list[str], list[str]]]:
    """(line, arguments, table lines) for each ``targetlm compare ARGS`` line (ARGS matching
    ``pattern``: in docs/history.md, starting with docs/records/) of an ``sh`` block in the
    markdown file ``path``, paired with the first markdown table after that block."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(REPO)
    found = []
    for match in re.finditer(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        commands = re.findall(rf"^targetlm compare ({pattern})$", match.group(1), flags=re.M)
        assert len(commands) <= 1, f"{name} line {line}: one compare per block"
        if commands:
            table = re.search(r"^\|.*?(?=^[^|]|\Z)", text[match.end() :], flags=re.M | re.S)
            assert table, f"{name} line {line}: no table after `targetlm compare {commands[0]}`"
            argv = shlex.split(commands[0].split("#")[0])
            found.append((line, argv, table.group(0).splitlines()))
    return found


def test_results_md_has_compare_tables_to_check():
    assert len(printed_tables()) >= 5


def check_printed_table(capsys, monkeypatch, name: str, line: int, argv: list[str], table):
    monkeypatch.chdir(REPO)
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, f"{name} line {line}: {err}"
    printed = [row for row in out.splitlines() if row.startswith("|")]
    assert printed == table, (
        f"{name} line {line}: the table under `targetlm compare {' '.join(argv)}` is stale"
    )


@pytest.mark.parametrize(
    ("line", "argv", "table"),
    [pytest.param(*case, id=f"line{case[0]}") for case in printed_tables()],
)
def test_each_results_md_table_is_what_its_compare_command_prints_from_the_records(
    capsys, monkeypatch, line, argv, table
):
    check_printed_table(capsys, monkeypatch, "docs/history.md", line, argv, table)


# docs/reproductions/*.md: every ``targetlm compare`` line that reads docs/records (with or
# without a LABEL: prefix, quoted globs included) sits over the table it prints today
REPRODUCTION_PAGES = sorted(REPRODUCTIONS.glob("*.md"))
REPRODUCTION_TABLES = [
    pytest.param(page, *case, id=f"{page.stem}-line{case[0]}")
    for page in REPRODUCTION_PAGES
    for case in printed_tables(page, pattern=r".*docs/records/.*")
]


def test_the_reproduction_pages_have_compare_tables_to_check():
    pages = {page.name for page in REPRODUCTION_PAGES}
    assert {"inan2017.md", "pappas2020.md", "heo2024.md", "heo2025.md", "README.md"} <= pages
    checked = {case.values[0].name for case in REPRODUCTION_TABLES}
    assert {"inan2017.md", "heo2024.md", "heo2025.md"} <= checked


@pytest.mark.parametrize(("page", "line", "argv", "table"), REPRODUCTION_TABLES)
def test_each_reproduction_table_is_what_its_compare_command_prints_from_the_records(
    capsys, monkeypatch, page, line, argv, table
):
    name = str(page.relative_to(REPO))
    check_printed_table(capsys, monkeypatch, name, line, argv, table)


def test_runs_of_several_tasks_are_refused_in_one_table(tmp_path, capsys):
    from targetlm.cli import main

    make_run(tmp_path, "lm-s1", seed=1, results=lm_results(100.0, 90.0))
    mlm = {"task": {"kind": "mlm"}}
    make_run(tmp_path, "mlm-s1", seed=1, config=mlm, results=lm_results(9.0, 8.0))
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "several tasks (lm: 1 runs, mlm: 1 runs)" in err and "\n" not in err.strip()
    assert main(["compare", str(tmp_path / "lm-s1")]) == 0
