"""``targetlm compare`` on records that targetlm would not write (steps past any count, λ
outside [0, 1], NaN figures, a seed that is not a whole number): one error line naming the
file; symbolic links inside a compared folder are not followed; a long learning curve is
thinned for --plot; stale temporary files of the plot are removed when it is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_error, tiny_config

from targetlm import compare
from targetlm import config as config_lib
from targetlm.cli import main


def write_record(
    directory: Path,
    results: dict | None = None,
    metrics: list[str] | None = None,
    seed: object = 1,
) -> Path:
    """A finished run's record: config.toml, results.json, metrics.jsonl."""
    directory.mkdir(parents=True)
    text = config_lib.dumps(tiny_config(**{"train.seed": 1}))
    (directory / "config.toml").write_text(
        text.replace("seed = 1\n", f"seed = {seed}\n"), encoding="utf-8"
    )
    results = results or {"valid": {"ppl": 10.0}, "test": {"ppl": 11.0}}
    (directory / "results.json").write_text(json.dumps(results), encoding="utf-8")
    lines = metrics or [json.dumps({"kind": "valid", "step": s, "ppl": 20.0 - s}) for s in (1, 2)]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"kind": "valid", "step": 1e999, "ppl": 3.0}', "step inf is not a step count"),
        (f'{{"kind": "valid", "step": {10**400}, "ppl": 3.0}}', "is not a step count"),
        ('{"kind": "valid", "step": 2.5, "ppl": 3.0}', "step 2.5 is not a step count"),
        ('{"kind": "valid", "step": 3, "ppl": NaN}', "valid ppl nan is not a figure"),
    ],
)
def test_a_metrics_record_that_is_not_a_step_and_figure(tmp_path, capsys, line, message):
    run = write_record(tmp_path / "run", metrics=[line])
    error = one_error(capsys, main(["compare", str(run)]))
    assert error.startswith(f"{run / 'metrics.jsonl'}, line 1: ") and message in error, error


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ({"valid": {"ppl": 3.0, "ensemble_lambda": float("inf")}}, "ensemble λ inf is not in"),
        ({"valid": {"ppl": 3.0, "ensemble_lambda": float("nan")}}, "ensemble λ nan is not in"),
        ({"valid": {"ppl": 3.0, "ensemble_lambda": 1.5}}, "ensemble λ 1.5 is not in [0, 1]"),
        ({"test": {"ppl": float("nan")}}, "test ppl is nan, not a figure"),
        ({"test": {"bleu": float("-inf")}}, "test bleu is -inf, not a figure"),
    ],
)
def test_a_lambda_or_figure_out_of_range(tmp_path, capsys, results, message):
    run = write_record(tmp_path / "run", results=results)
    error = one_error(capsys, main(["compare", str(run)]))
    assert error.startswith(f"{run}: ") and message in error, error


@pytest.mark.parametrize("seed", ["1.5", '"one"', "true"])
def test_a_seed_that_is_not_a_whole_number(tmp_path, capsys, seed):
    run = write_record(tmp_path / "run", seed=seed)
    error = one_error(capsys, main(["compare", str(run)]))
    assert error.startswith(f"{run}: ") and "train.seed" in error, error


def test_a_symbolic_link_inside_a_folder_is_skipped_not_followed(tmp_path, capsys):
    write_record(tmp_path / "runs" / "base-s1")
    (tmp_path / "runs" / "root").symlink_to("/")
    (tmp_path / "runs" / "loop").symlink_to(tmp_path / "runs")
    assert main(["compare", str(tmp_path / "runs"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [row["group"] for row in json.loads(out)["rows"]] == ["base"]
    assert err.splitlines() == [
        "targetlm compare: skipped symbolic links (not followed out of a folder): "
        f"{tmp_path / 'runs' / 'loop'}, {tmp_path / 'runs' / 'root'}"
    ]


def test_a_long_curve_is_thinned_for_the_plot_and_stale_temporary_files_go(
    tmp_path, capsys, monkeypatch
):
    steps = range(1, 3 * compare.MAX_PLOTTED_POINTS + 2)
    lines = [json.dumps({"kind": "valid", "step": s, "ppl": 5.0 + 1 / s}) for s in steps]
    run = write_record(tmp_path / "run", metrics=lines)
    plotted = []
    monkeypatch.setattr(
        compare, "write_figure", lambda path, fig: plotted.append(fig.axes[0].lines[0])
    )
    png = tmp_path / "curves.png"
    stale = tmp_path / ".curves.png.abc123.tmp"  # a write killed before its rename
    stale.write_bytes(b"half a figure")
    other = tmp_path / ".other.png.abc123.tmp"
    other.write_bytes(b"another output's")
    assert main(["compare", str(run), "--plot", str(png)]) == 0
    x = list(plotted[0].get_xdata())
    assert len(x) <= compare.MAX_PLOTTED_POINTS and x[0] == 1 and x[-1] == steps[-1]
    assert not stale.exists() and other.exists()
