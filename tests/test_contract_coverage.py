"""Every registered component is covered by the contract tests: a newly registered kind
without test options in ``conftest.py`` fails here (a test in ``conftest.py`` is never collected)."""

from __future__ import annotations

from conftest import ENCODER_OPTIONS, OUTPUT_OPTIONS

from targetlm.modules import ENCODERS, OUTPUT_LAYERS


def test_every_encoder_has_test_options():
    assert set(ENCODER_OPTIONS) == set(ENCODERS.names())


def test_every_output_layer_has_test_options():
    assert set(OUTPUT_OPTIONS) == set(OUTPUT_LAYERS.names())
