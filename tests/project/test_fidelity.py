"""docs/fidelity.md states each preset value it discusses as `PRESETS: key = value`; check them.

PRESETS is a glob over the names in configs/ (``inan-small-ptb-*``, ``tf-small-ptb-{sim,wdr}-n4``
is not supported: use ``*``); key is a dotted path in the resolved config, where a component
option the preset leaves out is its constructor's default; value is TOML. A claim that names no
preset, or a preset value that differs from the table, fails.

The second half checks the budgets (training tokens, epochs, patience) that docs/history.md,
docs/fidelity.md and the experiment scripts' headers state against what the scripts run.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

from targetlm import config as config_lib
from targetlm.modules import ENCODERS, HEADS, INPUT_EMBEDDINGS, OUTPUT_LAYERS
from targetlm.objectives import OBJECTIVES
from targetlm.tasks import TASKS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CLAIM = re.compile(r"`([a-z0-9*?-]+): ([a-z_.]+) = ([^`]+)`")
REGISTRIES = {
    "model.embedding": INPUT_EMBEDDINGS,
    "model.encoder": ENCODERS,
    "model.output": OUTPUT_LAYERS,
    "model.heads": HEADS,
    "objective": OBJECTIVES,
    "task": TASKS,
}


def claims() -> list[tuple[str, str, str]]:
    return CLAIM.findall((ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8"))


def resolved(config: config_lib.Config, key: str):
    """The value of dotted ``key`` in ``config``, defaults of component options included."""
    data = config.to_dict()
    table, _, option = key.rpartition(".")
    node = data
    for part in table.split("."):
        node = node[part]
    if option in node:
        return node[option]
    registry = REGISTRIES.get(table)
    if registry is None:
        raise KeyError(key)
    parameter = registry.options(node["kind"]).get(option)
    if parameter is None:
        raise KeyError(key)
    return parameter.default


def test_the_table_states_preset_values():
    assert len(claims()) >= 40, "docs/fidelity.md lost its preset claims"


@pytest.mark.parametrize("presets,key,value", claims())
def test_fidelity_claim_matches_the_presets(presets, key, value):
    names = sorted(p.stem for p in (ROOT / "configs").glob("*.toml"))
    matched = fnmatch.filter(names, presets)
    assert matched, f"no preset matches {presets!r}"
    expected = tomllib.loads(f"x = {value}")["x"]
    for name in matched:
        actual = resolved(config_lib.load(ROOT / "configs" / f"{name}.toml"), key)
        if isinstance(actual, tuple):
            actual = list(actual)
        assert actual == expected, f"{name}: {key} = {actual!r}, docs/fidelity.md says {value}"


# --- the budgets the documents state against what the experiment scripts run ---------------
#
# docs/history.md puts the commands of each table in a fenced ``sh`` block whose comments state
# the budget (e.g. "first 50k tokens", "patience 5 (paper 50) within 30 epochs"), and the
# experiment scripts' comment headers state their defaults (e.g. "TOKENS training tokens
# (default 50k)"). The tests below run those commands and scripts with a stand-in ``targetlm``
# on PATH that records each call instead of training, resolve every recorded ``targetlm train``
# (its preset plus its ``--set`` overrides) and compare the stated numbers with the resolved
# config, so a table, its script and docs/fidelity.md cannot disagree unnoticed.

BUDGET_KEYS = {
    "tokens": "data.train_tokens",
    "epochs": "train.epochs",
    "patience": "train.early_stopping",
    "plateau": "train.patience",
    "steps": "train.max_steps",
}
# (pattern, quantity): group 1 is the stated number, "k" meaning thousands; "preset_epochs" is
# the preset's own train.epochs, before the command's overrides
STATED_BUDGET = [
    (r"\bfirst (\d+k?) (?:PTB )?(?:training )?tokens", "tokens"),
    (r"\bTOKENS (?:PTB )?(?:training )?tokens \(default (\d+k?)", "tokens"),
    (r"\b(?:for|within) (\d+) epochs", "epochs"),
    (r"\b(\d+)-epoch cap", "epochs"),
    (r"\bEPOCHS (?:epochs )?\(default (\d+)", "epochs"),
    (r"\bpatience (\d+)", "patience"),
    (r"\bPATIENCE \(default (\d+)", "patience"),
    (r"\bstop after (\d+)", "patience"),
    (r"\bafter (\d+) (?:flat epochs|epochs without improvement)", "plateau"),
    (r"(?:\bpresets say|\bpresets'|\bpreset's) (\d+)\b", "preset_epochs"),
    (r"\bSTEPS optimiser steps \(default (\d+k?)", "steps"),
    (r"\b(\d+k?) optimiser steps\b", "steps"),
]
# how to run each script whose header states a budget (the arguments are examples: the header's
# defaults hold for any method and seed); common.sh is sourced, so it is run through a user
SCRIPT_EXAMPLES = {
    "common.sh": ("heo_lstm_ptb.sh", ["1", "base"]),
    "diffusion_multi30k.sh": ("diffusion_multi30k.sh", ["en-de", "base", "1"]),
    "diversity.sh": ("diversity.sh", []),
    "head_kinds_ptb.sh": ("head_kinds_ptb.sh", ["1"]),
    "heo_tf_ptb.sh": ("heo_tf_ptb.sh", ["base", "1"]),
    "inan_ptb_cpu.sh": ("inan_ptb_cpu.sh", ["base", "1"]),
    "inan_small_ptb.sh": ("inan_small_ptb.sh", ["1"]),
    "mlm_brown.sh": ("mlm_brown.sh", ["wdr-n2", "1"]),
    "pappas_ptb_cpu.sh": ("pappas_ptb_cpu.sh", ["tied", "1"]),
    "tt_rf_ptb.sh": ("tt_rf_ptb.sh", ["tt", "wdr", "1"]),
}
STAND_IN = r"""#!/usr/bin/env bash
# records the call (arguments separated by \x1f) instead of running targetlm
{ printf '%s\x1f' "$@"; printf '\n'; } >> "$TARGETLM_CALLS"
if [[ $1 == train ]]; then
  while [[ $# -gt 0 ]]; do [[ $1 == --run-dir ]] && mkdir -p "$2"; shift; done
else
  echo '{"bleu": 0.0, "sentences_per_s": 0.0}'
fi
"""


def stated_budget(text: str) -> list[tuple[str, int]]:
    """Every (quantity, number) that ``text`` states, by the STATED_BUDGET patterns."""
    text = " ".join(text.split())
    found = []
    for pattern, quantity in STATED_BUDGET:
        for number in re.findall(pattern, text):
            found.append(
                (quantity, int(number[:-1]) * 1000 if number.endswith("k") else int(number))
            )
    return found


def recorded_trainings(tmp_path: Path, command: str, env: dict[str, str] | None = None):
    """Run ``command`` (bash) with the stand-in targetlm; the ``targetlm train`` calls it made.

    Returns one (config path, overrides) per run directory, from the first call that trained
    it (a later call continues a run: its budget is stated apart).
    """
    work = tmp_path / "work"
    bin_dir = tmp_path / "bin"
    if not work.exists():
        work.mkdir()
        bin_dir.mkdir()
        for name in ("experiments", "configs"):
            (work / name).symlink_to(ROOT / name)
        (bin_dir / "targetlm").write_text(STAND_IN, encoding="utf-8")
        (bin_dir / "targetlm").chmod(0o755)
        (bin_dir / "python").symlink_to(sys.executable)
    calls = tmp_path / "calls.txt"
    calls.write_text("", encoding="utf-8")
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TARGETLM_DATA": str(tmp_path / "data"),
        "TARGETLM_CALLS": str(calls),
        **(env or {}),
    }
    completed = subprocess.run(
        ["bash", "-c", command], cwd=work, env=environment, capture_output=True, text=True
    )
    assert completed.returncode == 0, f"{command!r} failed: {completed.stderr[-2000:]}"
    trainings = {}
    for line in calls.read_text(encoding="utf-8").splitlines():
        arguments = line.split("\x1f")[:-1]
        if arguments[:1] != ["train"]:
            continue
        run_dir = arguments[arguments.index("--run-dir") + 1]
        overrides = [arguments[i + 1] for i, a in enumerate(arguments) if a == "--set"]
        trainings.setdefault(run_dir, (arguments[1], overrides))
    return list(trainings.items())


def resolved_budget(config_path: str, overrides: list[str], quantity: str) -> int:
    if quantity == "preset_epochs":
        return config_lib.load(ROOT / config_path).train.epochs
    table, _, option = BUDGET_KEYS[quantity].partition(".")
    return config_lib.load(ROOT / config_path, overrides).to_dict()[table][option]


def mismatches(trainings, stated) -> list[str]:
    wrong = []
    for run_dir, (config_path, overrides) in trainings:
        for quantity, number in stated:
            actual = resolved_budget(config_path, overrides, quantity)
            if actual != number:
                wrong.append(f"{run_dir}: states {quantity} {number}, runs with {actual}")
    return wrong


def results_blocks() -> list[tuple[int, str, str]]:
    """(line, comments, commands) of each ``sh`` block of docs/history.md that states a budget.

    comments: the block's comment text (whole-line and trailing ``  # ...``); commands: the
    statements that train (``bash experiments/...``, ``targetlm train``, loops around them,
    ``export``), continuation lines joined.
    """
    text = (ROOT / "docs" / "history.md").read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        line_number = text.count("\n", 0, match.start()) + 1
        comments, statements, pending = [], [], ""
        for line in match.group(1).replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#"):
                comments.append(line.lstrip()[1:])
                continue
            code, _, comment = line.partition("  # ")
            comments.append(comment)
            pending += code + "\n"
            depth = len(re.findall(r"\bdo\b", pending)) - len(re.findall(r"\bdone\b", pending))
            if depth <= 0:
                statements.append(pending)
                pending = ""
        trains = [
            s
            for s in statements
            if re.search(r"bash experiments/|targetlm train\b", s)
            or s.lstrip().startswith("export ")
        ]
        comment_text = " ".join(comments)
        if stated_budget(comment_text):
            blocks.append((line_number, comment_text, "".join(trains)))
    return blocks


def script_headers() -> list[tuple[str, dict[str, str], str]]:
    """(script, env, header paragraph) per paragraph of each experiments/*.sh comment header.

    A paragraph that starts ``VAR=value`` (e.g. ``REGIME=large``) describes the script run with
    that variable set; the others describe its defaults.
    """
    paragraphs = []
    for script in sorted((ROOT / "experiments").glob("*.sh")):
        lines = script.read_text(encoding="utf-8").splitlines()
        header = []
        for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
            if not line.startswith("#"):
                break
            header.append(line[1:].strip())
        for paragraph in "\n".join(header).split("\n\n"):
            setting = re.match(r"([A-Z_]+)=(\S+?)\b", paragraph)
            env = {setting.group(1): setting.group(2)} if setting else {}
            paragraphs.append((script.name, env, paragraph))
    return paragraphs


def test_results_blocks_state_budgets():
    lines = [line for line, _, _ in results_blocks()]
    assert len(lines) >= 3, f"docs/history.md: only {lines} state a budget; the parser broke?"
    assert all(commands for _, _, commands in results_blocks())


@pytest.mark.parametrize(
    "line,comments,commands", results_blocks(), ids=[f"line{b[0]}" for b in results_blocks()]
)
def test_results_block_budget_matches_its_scripts(tmp_path, line, comments, commands):
    stated = stated_budget(comments)
    trainings = recorded_trainings(tmp_path, commands)
    assert trainings, f"docs/history.md line {line}: states {stated} but trains nothing"
    wrong = mismatches(trainings, stated)
    assert not wrong, f"docs/history.md line {line}: " + "; ".join(wrong)


HEADERS_WITH_BUDGETS = [header for header in script_headers() if stated_budget(header[2])]


@pytest.mark.parametrize(
    "script,env,paragraph",
    HEADERS_WITH_BUDGETS,
    ids=[f"{s}{''.join(f'-{k}={v}' for k, v in e.items())}" for s, e, _ in HEADERS_WITH_BUDGETS],
)
def test_script_header_states_its_defaults(tmp_path, script, env, paragraph):
    assert script in SCRIPT_EXAMPLES, f"{script}: add an example invocation to SCRIPT_EXAMPLES"
    runner, arguments = SCRIPT_EXAMPLES[script]
    command = " ".join(["bash", f"experiments/{runner}", *arguments])
    trainings = recorded_trainings(tmp_path, command, env)
    assert trainings, f"{command} trained nothing"
    wrong = mismatches(trainings, stated_budget(paragraph))
    assert not wrong, f"experiments/{script} header: " + "; ".join(wrong)


def test_fidelity_cpu_regimes_are_the_tables_budgets(tmp_path):
    """Each "The CPU regime (`experiments/X.sh`)" paragraph states the budget of a table."""
    text = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    regimes = re.findall(
        r"^\*\*The CPU regime\*\* \(`experiments/([\w.]+)`\)(.*?)\n\n", text, re.M | re.S
    )
    assert len(regimes) >= 2, "docs/fidelity.md lost its CPU-regime paragraphs"
    blocks = results_blocks()
    for script, paragraph in regimes:
        stated = stated_budget(paragraph)
        assert stated, f"fidelity.md's {script} regime states no budget"
        users = [b for b in blocks if f"experiments/{script}" in b[2]]
        assert users, f"no docs/history.md block runs experiments/{script}"
        agreeing = [
            line
            for line, _, commands in users
            if not mismatches(recorded_trainings(tmp_path, commands), stated)
        ]
        assert agreeing, f"fidelity.md's {script} regime ({stated}) is no table's budget"
