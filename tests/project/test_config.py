"""Config contracts: TOML in, validated frozen dataclasses out; every mistake is one
ConfigError that names the key; --set overrides; dumps() round-trips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import extra_marks

from targetlm import builders, extras
from targetlm import config as config_lib
from targetlm.config import ComponentConfig, Config, apply_overrides, dumps, parse_value
from targetlm.lexicon.lexicon import Lexicon
from targetlm.registry import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.toml"))
QUICKSTART = REPO / "configs" / "quickstart.toml"


# every preset is a case; one whose components need an optional package that is absent here
# skips, saying what to install (targetlm.extras asks each component's own check)
PRESET_CASES = [pytest.param(p, marks=extra_marks(config_lib.load(p))) for p in PRESETS]


def test_presets_exist():
    assert QUICKSTART in PRESETS and len(PRESETS) >= 3


def test_the_optional_packages_a_config_needs():
    def names(preset: str) -> list[str]:
        return [e.name for e in extras.needed(config_lib.load(REPO / "configs" / preset))]

    assert names("quickstart.toml") == [] and names("tt-ptb-base.toml") == []
    assert names("rf-ptb-base.toml") == ["reformer"]
    assert names("smollm2-wt2-base.toml") == ["hf"]  # the backbone and its tokenizer: one path


def test_a_missing_package_is_named_as_building_the_config_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reformer_pytorch", None)  # as if not installed
    config = config_lib.load(REPO / "configs" / "rf-ptb-base.toml")
    [extra] = extras.needed(config)
    message = extra.missing()
    assert message is not None and "needs reformer-pytorch" in message
    with pytest.raises(ConfigError) as info:
        builders.validate(config)
    assert message in str(info.value)  # the component's own error
    assert extras.missing(config) == [
        f"{message} (in a checkout: bash scripts/setup.sh --reformer)"
    ]


def test_load_a_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        """
[data]
name = "ptb"
batch_size = 8

[model.encoder]
kind = "lstm"
hidden_size = 64

[train]
lr = 1          # an integer where a float is expected widens
betas = [0.9, 0.98]
""",
        encoding="utf-8",
    )
    config = builders.load_config(path)
    assert config.data.name == "ptb" and config.data.batch_size == 8
    assert config.data.bptt == 35  # default kept
    assert config.model.encoder == ComponentConfig("lstm", {"hidden_size": 64})
    assert config.model.output == ComponentConfig("tied")  # default component
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float)
    assert config.train.betas == (0.9, 0.98)


def test_empty_file_gives_the_defaults(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("", encoding="utf-8")
    assert builders.load_config(path) == Config()


def test_missing_file_and_invalid_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        builders.load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        builders.load_config(bad)


def test_config_is_frozen():
    config = Config()
    with pytest.raises(AttributeError):
        config.train.lr = 3.0  # type: ignore[misc]


@pytest.mark.parametrize("path", PRESET_CASES, ids=lambda p: p.stem)
def test_every_preset_loads_and_validates(path):
    config = builders.load_config(path)
    builders.validate(config)  # idempotent: a checked config checks again
    # the validated config builds (on the meta device, no WordNet) a model with weights
    with torch.device("meta"):
        model = builders.build_model(config.model, 8, lexicon=Lexicon())
    assert sum(p.numel() for p in model.parameters()) > 0
    assert builders.config_from_dict(config.to_dict()) == config


@pytest.mark.parametrize("path", PRESET_CASES, ids=lambda p: p.stem)
def test_dumps_round_trips_every_preset(path):
    config = config_lib.load(path)  # builders.load_config's check: the test above
    text = dumps(config)
    again = builders.config_from_dict(tomllib.loads(text))
    assert again == config
    # and through a file, as in a run directory
    assert dumps(again) == text


def test_dumps_round_trips_overridden_values(tmp_path):
    config = builders.load_config(
        QUICKSTART,
        [
            'data.dir="/data/my corpus \\"v2\\""',
            "train.lr=1e-05",
            "train.betas=[0.8, 0.9]",
            "data.lowercase=true",
            'data.name="wikitext-2"',
            "model.encoder.init_range=0.05",
        ],
    )
    path = tmp_path / "config.toml"
    path.write_text(dumps(config), encoding="utf-8")
    assert builders.load_config(path) == config


def test_dumps_round_trips_non_bmp_characters():
    config = builders.load_config(QUICKSTART, ['data.dir="/data/\U0001f600"'])
    assert builders.config_from_dict(tomllib.loads(dumps(config))) == config


# --- every mistake is one ConfigError naming the key ----------------------------------------


@pytest.mark.parametrize(
    "override, fragments",
    [
        # unknown keys
        ("lrr=1", ["lrr", "allowed"]),
        ("train.lrr=1", ["train.lrr", "allowed", "lr"]),
        ("data.synthetic.seedd=3", ["data.synthetic.seedd"]),
        ("model.encoder.hidden_sizee=3", ["model.encoder.hidden_sizee", "hidden_size"]),
        ("objective.smoothing=0.1", ["objective.smoothing", "label_smoothing"]),
        # context arguments are supplied by the builders, never by a config
        ("model.encoder.input_size=3", ["model.encoder.input_size"]),
        ("model.output.vocab_size=3", ["model.output.vocab_size"]),
        # wrong types
        ('train.lr="fast"', ["train.lr", "number", "fast"]),
        ("data.batch_size=1.5", ["data.batch_size", "integer", "1.5"]),
        ("train.epochs=true", ["train.epochs", "integer"]),
        ("train.progress=1", ["train.progress", "true or false"]),
        ("data.dir=3", ["data.dir"]),
        ('train.betas=[0.9, "x"]', ["train.betas[1]"]),
        ("model.encoder.hidden_size=12.5", ["model.encoder.hidden_size", "integer"]),
        ('objective.label_smoothing="a"', ["objective.label_smoothing"]),
        ("data=3", ["data", "table"]),
        ("model.encoder=3", ["model.encoder", "table"]),
        # invalid values
        ('train.optimizer="rmsprop"', ["train.optimizer", "rmsprop", "'sgd'", "'adam'", "'adamw'"]),
        ('train.schedule="exponential"', ["train.schedule", "epoch_decay"]),
        ("data.batch_size=0", ["data.batch_size", "0 is not in [1, "]),
        ("data.bptt=-1", ["data.bptt"]),
        ("train.lr=0", ["train.lr: 0.0 is not in (0, inf)"]),
        ("train.decay_factor=1.5", ["train.decay_factor: 1.5 is not in (0, 1]"]),
        ("train.max_steps=-1", ["train.max_steps"]),
        ('train.schedule="inverse_sqrt"', ["train.warmup_steps"]),
        ("model.encoder.dropout_input=1.5", ["model.encoder", "dropout_input", "1.5"]),
        ("model.encoder.num_layers=0", ["model.encoder", "num_layers"]),
        ('model.encoder.kind="gru"', ["encoder", "gru", "lstm", "transformer"]),
        ('model.output.kind="softmax"', ["softmax", "lookup", "tied"]),
        ('objective.kind="nce"', ["nce", "cross_entropy"]),
    ],
)
def test_mistakes_are_config_errors_naming_the_key(override, fragments):
    with pytest.raises(ConfigError) as info:
        builders.load_config(QUICKSTART, [override])
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_unknown_key_in_a_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nlrr = 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown key train\.lrr"):
        builders.load_config(path)


def test_component_without_kind(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[model.encoder]\nhidden_size = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model\.encoder\.kind"):
        builders.load_config(path)


def test_synthetic_lexicon_size_is_validated():
    with pytest.raises(ConfigError, match="data.synthetic.nouns"):
        builders.load_config(QUICKSTART, ["data.synthetic.nouns=3"])


def test_negative_eval_segment_is_validated():
    with pytest.raises(ConfigError, match="eval.segment"):
        builders.load_config(QUICKSTART, ["eval.segment=-1"])


# --- --set overrides ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("3", 3),
        ("-2", -2),
        ("0.5", 0.5),
        ("1e-3", 0.001),
        ("true", True),
        ("false", False),
        ('"x y"', "x y"),
        ("adam", "adam"),  # a bare word is a string
        ("wikitext-2", "wikitext-2"),
        ("/tmp/my data", "/tmp/my data"),
        ("[1, 2]", [1, 2]),
        ("[0.9, 0.98]", [0.9, 0.98]),
        ('["a", "b"]', ["a", "b"]),
    ],
)
def test_parse_value(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_apply_overrides_nested_keys_and_no_mutation():
    data = {"train": {"lr": 1.0}, "model": {"encoder": {"kind": "lstm"}}}
    result = apply_overrides(
        data,
        [
            "train.lr=0.5",
            "model.encoder.hidden_size=64",
            "data.synthetic.seed=7",
            "train.progress=false",
            " data.dir = /a=b ",
            "train.betas=[0.9, 0.98]",
        ],
    )
    assert result == {
        "train": {"lr": 0.5, "progress": False, "betas": [0.9, 0.98]},
        "model": {"encoder": {"kind": "lstm", "hidden_size": 64}},
        "data": {"synthetic": {"seed": 7}, "dir": "/a=b"},
    }
    assert data == {"train": {"lr": 1.0}, "model": {"encoder": {"kind": "lstm"}}}


def test_later_overrides_win():
    assert apply_overrides({}, ["train.lr=1", "train.lr=2"]) == {"train": {"lr": 2}}


@pytest.mark.parametrize("item", ["train.lr", "=3", ""])
def test_override_without_key_or_equals_is_an_error(item):
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, [item])


def test_override_through_a_value_is_an_error():
    with pytest.raises(ConfigError, match="not a table"):
        apply_overrides({"train": {"lr": 1.0}}, ["train.lr.x=1"])


def test_load_with_overrides_and_replace():
    config = builders.load_config(
        QUICKSTART,
        [
            "train.lr=0.5",
            "train.optimizer=sgd",
            "model.encoder.hidden_size=64",
            "data.lowercase=true",
        ],
    )
    assert config.train.lr == 0.5 and config.train.optimizer == "sgd"
    assert config.model.encoder.options["hidden_size"] == 64
    assert config.model.encoder.options["num_layers"] == 2  # untouched options are kept
    assert config.data.lowercase is True
    replaced = config.replace(["train.epochs=2"])
    assert replaced.train.epochs == 2 and replaced.train.lr == 0.5
    assert config.train.epochs == 8  # the original is unchanged
    with pytest.raises(ConfigError, match="train.epochs"):
        config.replace(["train.epochs=zero"])


def test_changing_the_component_kind_keeps_options_checked():
    # switching encoder kind keeps the LSTM options, which the Transformer does not accept
    with pytest.raises(ConfigError, match="model.encoder.hidden_size"):
        builders.load_config(QUICKSTART, ['model.encoder.kind="transformer"'])


def test_configuration_is_plain_data():
    """``targetlm.config`` checks values only; building components is ``targetlm.builders``."""
    config = config_lib.load(QUICKSTART, ['model.encoder.kind="transformer"'])  # values are fine
    with pytest.raises(ConfigError, match="model.encoder.hidden_size"):
        builders.validate(config)
