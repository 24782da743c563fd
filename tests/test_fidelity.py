"""docs/fidelity.md states each preset value it discusses as `PRESETS: key = value`; check them.

PRESETS is a glob over the names in configs/ (``inan-small-ptb-*``, ``tf-small-ptb-{sim,wdr}-n4``
is not supported: use ``*``); key is a dotted path in the resolved config, where a component
option the preset leaves out is its constructor's default; value is TOML. A claim that names no
preset, or a preset value that differs from the table, fails.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import pytest

from targetlm import config as config_lib
from targetlm.modules import ENCODERS, HEADS, INPUT_EMBEDDINGS, OUTPUT_LAYERS
from targetlm.objectives import OBJECTIVES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CLAIM = re.compile(r"`([a-z0-9*?-]+): ([a-z_.]+) = ([^`]+)`")
REGISTRIES = {
    "model.embedding": INPUT_EMBEDDINGS,
    "model.encoder": ENCODERS,
    "model.output": OUTPUT_LAYERS,
    "model.heads": HEADS,
    "objective": OBJECTIVES,
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
