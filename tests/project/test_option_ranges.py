"""Every numeric option has a declared valid range, and a value outside it is one ConfigError
line naming the key, the value and the range, raised by ``builders.validate`` before anything
is written. The options are drawn from the dataclass configs and from every registry's
constructors, so a new option without a range fails here."""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import importlib
import inspect
import math
import pkgutil
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import targetlm
from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli import build_parser, main
from targetlm.config import RANGES, Config
from targetlm.objectives.ngram import NGRAM_OPTIONS
from targetlm.registry import ConfigError, Range, Registry, is_numeric, option_range

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.toml"))
QUICKSTART = REPO / "configs" / "quickstart.toml"
HUGE_FLOAT, HUGE_INT = 1e30, 2**70
BAD_VALUES = [math.nan, math.inf, -math.inf, -1, 0, HUGE_FLOAT, HUGE_INT]

for module in pkgutil.walk_packages(targetlm.__path__, "targetlm."):
    if not module.name.endswith("__main__"):  # every registry, wherever it is declared
        importlib.import_module(module.name)
REGISTRIES = [
    registry
    for registry in Registry.instances
    if all(registry.get(n).__module__.startswith("targetlm.") for n in registry.names())
]
# where each registry's options live in a config; None: not a config table (CLI flags)
PREFIXES = {
    "input embedding": "model.embedding",
    "encoder": "model.encoder",
    "output layer": "model.output",
    "heads": "model.heads",
    "backbone": "model.backbone",
    "objective": "objective",
    "task": "task",
    "tokenizer": "data",
    "combiner": None,
}


def _numeric_fields(cls: type, prefix: str) -> dict[str, Any]:
    """Dotted key -> annotation of every numeric field of a dataclass config, nested ones too."""
    fields = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key, hint = f"{prefix}.{field.name}" if prefix else field.name, hints[field.name]
        if dataclasses.is_dataclass(hint):
            fields |= _numeric_fields(hint, key)
        elif is_numeric(hint):
            fields[key] = hint
    return fields


CONFIG_FIELDS = _numeric_fields(Config, "")
COMPONENT_OPTIONS = [
    (registry, name, option, hint)
    for registry in REGISTRIES
    for name in registry.names()
    for option, hint in registry.hints(name).items()
    if option in registry.options(name) and is_numeric(hint)
]


def _component_id(case: tuple) -> str:
    registry, name, option, _ = case
    return f"{registry.kind}:{name}.{option}"


def _is_list(hint: Any) -> bool:
    """A list of numbers (``tuple[Size, ...]``), not a number that may be None."""
    sequences = (list, tuple, collections.abc.Sequence)
    return any(typing.get_origin(a) in sequences for a in (hint, *typing.get_args(hint)))


def _accepts_int_only(hint: Any) -> bool:
    return "float" not in str(hint)


def _outside(value: float, hint: Any, valid: Range) -> bool:
    """Whether ``value`` is refused: out of the range, or a float for an integer option."""
    if isinstance(value, float) and _accepts_int_only(hint):
        return True
    return value not in valid


def _assert_one_line(error: ConfigError, key: str, valid: Range | None) -> str:
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(key) or f" {key}" in message, (key, message)
    if valid is not None:
        assert str(valid) in message, (str(valid), message)
    return message


# --- every numeric option declares a range ------------------------------------------------


def test_the_registries_are_all_found():
    assert set(PREFIXES) == {registry.kind for registry in REGISTRIES}
    assert len(COMPONENT_OPTIONS) > 100


def test_every_config_field_has_a_range():
    assert set(CONFIG_FIELDS) - set(RANGES) == set(), "numeric fields without a RANGES entry"
    assert set(RANGES) - set(CONFIG_FIELDS) == set(), "RANGES entries that are no numeric field"


@pytest.mark.parametrize("case", COMPONENT_OPTIONS, ids=_component_id)
def test_every_component_option_declares_a_range(case):
    registry, name, option, hint = case
    valid = option_range(hint)
    assert valid is not None, (
        f"{registry.kind} {name!r}: the numeric option {option!r} declares no range "
        "(annotate it: Size, Fraction, ... or Annotated[X, Range(...)] from targetlm.registry)"
    )
    default = registry.options(name)[option].default
    values = default if isinstance(default, (list, tuple)) else [default]
    for value in values:  # the default is a valid value
        if value is not None and value is not inspect.Parameter.empty:
            assert value in valid, (option, value, str(valid))


# --- the registry refuses every value outside, in one line -----------------------------------


@pytest.mark.parametrize("case", COMPONENT_OPTIONS, ids=_component_id)
def test_the_registry_refuses_values_outside_the_range(case):
    registry, name, option, hint = case
    valid = option_range(hint)
    key = f"{PREFIXES[registry.kind] or registry.kind}.{option}"
    required = {
        k: p.default if p.default is not p.empty else 0.5
        for k, p in registry.options(name).items()
        if p.default is p.empty
    }
    tried = 0
    for value in BAD_VALUES:
        if not _outside(value, hint, valid):
            continue
        tried += 1
        wrapped = [value] if _is_list(hint) else value
        with pytest.raises(ConfigError) as info:
            registry.validate(name, {**required, option: wrapped}, key.rpartition(".")[0])
        integer_for_float = isinstance(value, float) and _accepts_int_only(hint)
        _assert_one_line(info.value, key, None if integer_for_float else valid)
    assert tried >= 3, (key, str(valid))  # nan and ±inf at least


# --- builders.validate refuses them before anything is built or written ----------------------


def _table(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _kind(data: dict[str, Any], prefix: str) -> str | None:
    if prefix == "data":
        return data.get("data", {}).get("tokenizer", "whitespace")
    node: Any = data
    for part in prefix.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    defaults = {"model.heads": "none", "model.backbone": "none", "objective": "cross_entropy"}
    return node.get("kind", defaults.get(prefix, "lm" if prefix == "task" else None))


def _base_config(prefix: str, kind: str) -> dict[str, Any] | None:
    """A preset that uses ``kind`` at ``prefix``, else the quickstart switched to it if that
    validates; None: neither."""
    for path in PRESETS:
        data = _table(path)
        if _kind(data, prefix) == kind and data.get("model", {}).get("backbone") is None:
            return data
    data = _set(
        _table(QUICKSTART), "data.tokenizer" if prefix == "data" else f"{prefix}.kind", kind
    )
    try:
        builders.config_from_dict(data)
    except ConfigError:
        return None
    return data


def _set(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    data = config_lib.apply_overrides(data, [])  # a deep copy
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def _first_bad_value(hint: Any, valid: Range) -> Any:
    floats = not _accepts_int_only(hint)
    value = next(v for v in BAD_VALUES if isinstance(v, float) == floats and v not in valid)
    return [value] if _is_list(hint) else value


BUILT_OPTIONS = [
    pytest.param(PREFIXES[registry.kind], name, option, hint, id=_component_id(case))
    for case in COMPONENT_OPTIONS
    for registry, name, option, hint in [case]
    if PREFIXES[registry.kind] is not None and registry.kind != "backbone"
]


@pytest.mark.parametrize("prefix, kind, option, hint", BUILT_OPTIONS)
def test_builders_validate_refuses_a_component_option_outside_its_range(prefix, kind, option, hint):
    base = _base_config(prefix, kind)
    if base is None:
        pytest.skip(f"no preset uses {prefix}.kind = {kind!r} (the registry test covers it)")
    valid = option_range(hint)
    value = _first_bad_value(hint, valid)
    key = f"{prefix}.{option}"
    with pytest.raises(ConfigError) as info:
        builders.config_from_dict(_set(base, key, value))
    _assert_one_line(info.value, key, None)
    assert "is not in" in str(info.value), str(info.value)


@pytest.mark.parametrize("key", sorted(CONFIG_FIELDS))
def test_builders_validate_refuses_config_values_outside_their_range(key):
    hint, valid = CONFIG_FIELDS[key], RANGES[key]
    base = _table(QUICKSTART)
    default = config_lib.option_value(Config(), key)
    tried = 0
    for value in BAD_VALUES:
        if not _outside(value, hint, valid):
            continue
        tried += 1
        wrapped = [value] * len(default) if isinstance(default, tuple) else value
        with pytest.raises(ConfigError) as info:
            builders.config_from_dict(_set(base, key, wrapped))
        integer_for_float = isinstance(value, float) and _accepts_int_only(hint)
        _assert_one_line(info.value, key, None if integer_for_float else valid)
    assert tried >= 3, (key, str(valid))


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=nan", "train.lr: nan is not in (0, inf)"),
        ("train.lr=inf", "train.lr: inf is not in (0, inf)"),
        ("train.heads_lr=nan", "train.heads_lr: nan is not in [0, inf)"),
        ("train.clip=nan", "train.clip: nan is not in [0, inf) (0: no clipping)"),
        ("train.clip=-1", "train.clip: -1.0 is not in [0, inf)"),
        ("train.momentum=-1", "train.momentum: -1.0 is not in [0, 1)"),
        ("train.weight_decay=nan", "train.weight_decay: nan is not in [0, inf)"),
        ("train.betas=[2, 3]", "train.betas[0]: 2.0 is not in [0, 1)"),
        ("train.betas=[]", "train.betas: [] is not two values"),
        ("train.betas=[0.9, 0.99, 0.999]", "train.betas: [0.9, 0.99, 0.999] is not two values"),
        ("model.embedding.size=-4", "model.embedding.size: -4 is not in [1, 1048576]"),
        ("model.encoder.hidden_size=1000000000", "model.encoder.hidden_size: 1000000000 is not"),
        ("train.seed=1180591620717411303424", "train.seed: 1180591620717411303424 is not in [0, "),
        ("train.threads=100000", "train.threads: 100000 is not in [0, 1024]"),
        ("data.vocab_size=1000000000", "data.vocab_size: 1000000000 is not in [1, 16777216]"),
        ("model.heads.kind=wdr\0model.heads.n=68", "model.heads.n: 68 is not in [1, 64]"),
        ("model.heads.kind=wdr\0objective.ngram_alpha=nan", "objective.ngram_alpha: nan is not"),
    ],
)
def test_the_reported_values_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        builders.load_config(QUICKSTART, override.split("\0"))
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("key", sorted(NGRAM_OPTIONS))
def test_the_ngram_loss_options_have_ranges(key):
    valid = option_range(NGRAM_OPTIONS[key][1])
    assert valid is not None and -1 not in valid and math.nan not in valid
    heads = ["model.heads.kind=simple"]
    for value in ("nan", "inf", "-1"):
        with pytest.raises(ConfigError, match=f"objective.{key}: .* is not in"):
            builders.load_config(QUICKSTART, [*heads, f"objective.{key}={value}"])


def test_transformer_dropout_of_one_is_refused_like_the_lstm_s():
    transformer = ["model.encoder.kind=transformer", "model.encoder.dropout=1.0"]
    with pytest.raises(ConfigError, match=r"model.encoder.dropout: 1.0 is not in \[0, 1\)"):
        builders.config_from_dict(
            config_lib.apply_overrides({"model": {"encoder": {}}}, transformer)
        )
    with pytest.raises(ConfigError, match="model.encoder.dropout_input: 1.0 is not in"):
        builders.load_config(QUICKSTART, ["model.encoder.dropout_input=1.0"])


def test_the_boundaries_themselves():
    assert builders.load_config(QUICKSTART, ["train.clip=0", "train.momentum=0"])  # 0: off
    assert builders.load_config(QUICKSTART, ["train.seed=9223372036854775807"])
    with pytest.raises(ConfigError, match="train.seed"):
        builders.load_config(QUICKSTART, ["train.seed=-1"])
    with pytest.raises(ConfigError, match="train.progress: expected true or false"):
        builders.load_config(QUICKSTART, ["train.progress=1"])  # a bool is not a number


def test_range_semantics():
    unit = Range(0, 1, high_open=True)
    assert str(unit) == "[0, 1)" and 0 in unit and 0.5 in unit and 1 not in unit
    assert str(Range(0)) == "[0, inf)" and math.inf not in Range(0)
    assert str(Range(0, low_open=True)) == "(0, inf)" and 0 not in Range(0, low_open=True)
    assert math.inf in Range(0, math.inf, high_open=False)  # only where a range says so
    assert math.nan not in Range() and -math.inf not in Range()
    with pytest.raises(ValueError):
        Range(2, 1)


def test_train_with_a_value_outside_its_range_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc = main(["train", str(QUICKSTART), "--run-dir", str(run_dir), "--set", "train.lr=nan"])
    _, err = capsys.readouterr()
    assert rc != 0
    assert err.splitlines() == ["targetlm: error: train.lr: nan is not in (0, inf)"], err
    assert not run_dir.exists()


# --- the numeric flags of the commands that read a run ---------------------------------------

RUN_COMMANDS = ("generate", "translate", "eval", "score")


def _numeric_flags() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action)
        for command in RUN_COMMANDS
        for action in commands.choices[command]._actions
        if action.type is not None and action.type not in (Path, str)
    ]


NUMERIC_FLAGS = _numeric_flags()


def test_the_numeric_flags_are_found():
    flags = {(command, action.option_strings[0]) for command, action in NUMERIC_FLAGS}
    assert {("generate", "--temperature"), ("translate", "--length-penalty")} <= flags
    assert {("eval", "--ensemble-lambda"), ("score", "--neural-cache")} <= flags


@pytest.mark.parametrize(
    "command, action", NUMERIC_FLAGS, ids=[f"{c}{a.option_strings[0]}" for c, a in NUMERIC_FLAGS]
)
def test_every_numeric_flag_refuses_nan_and_infinities(command, action):
    assert action.type not in (int, float), f"{command} {action.option_strings[0]}: no range"
    for text in ("nan", "inf", "-inf", "1e30", str(2**70), "x"):
        try:
            value = action.type(text)
        except argparse.ArgumentTypeError as error:
            assert "\n" not in str(error)
            continue
        values = value if isinstance(value, list) else [value]  # a huge value may be valid
        assert all(math.isfinite(v) for v in values), (text, value)
        assert text not in ("nan", "inf", "-inf", "x"), (command, action.option_strings, text)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["generate", "RUN", "--temperature", "nan"],
            "argument --temperature: nan is not in [0, inf)",
        ),
        (["generate", "RUN", "--top-p", "0"], "argument --top-p: 0.0 is not in (0, 1]"),
        (["generate", "RUN", "--top-k", "-1"], "argument --top-k: -1 is not in [0, "),
        (
            ["translate", "RUN", "--input", "S", "--length-penalty", "nan"],
            "--length-penalty: nan is",
        ),
        (["translate", "RUN", "--input", "S", "--ensemble-lambda", "inf"], "inf is not in [0, 1]"),
        (
            ["translate", "RUN", "--input", "S", "--steps", "0"],
            "argument --steps: 0 is not in [1, ",
        ),
        (["eval", "RUN", "--ensemble-lambda", "0.5,nan"], "'0.5,nan': nan is not in [0, 1]"),
        (
            ["score", "RUN", "--file", "F", "--out", "O", "--unigram-cache", "1"],
            "1.0 is not in [0, 1)",
        ),
        (
            ["eval", "RUN", "--neural-cache", "0.1", "--neural-theta=-inf"],
            "-inf is not in (0, inf)",
        ),
    ],
)
def test_a_flag_outside_its_range_is_refused_before_the_run_is_read(capsys, argv, message):
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("targetlm: error: argument --"), lines
    assert message in lines[0] and f"(see targetlm {argv[0]} --help)" in lines[0], lines[0]
