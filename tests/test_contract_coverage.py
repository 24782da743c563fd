"""Every registered component is covered by the contract tests: a newly registered kind
without test options in ``conftest.py`` fails here (a test in ``conftest.py`` is never collected)."""

from __future__ import annotations

from conftest import (
    CONDITIONAL_ENCODER_OPTIONS,
    DENOISER_ENCODER_OPTIONS,
    ENCODER_OPTIONS,
    OUTPUT_OPTIONS,
)

from targetlm.modules import ENCODERS, OUTPUT_LAYERS


def test_every_encoder_has_test_options():
    tables = set(ENCODER_OPTIONS) | set(CONDITIONAL_ENCODER_OPTIONS) | set(DENOISER_ENCODER_OPTIONS)
    assert tables == set(ENCODERS.names())
    for name in ENCODERS.names():  # each in the table of the contract tests that can run it
        conditional = ENCODERS.get(name).conditional
        denoiser = getattr(ENCODERS.get(name), "denoiser", False)
        assert (name in DENOISER_ENCODER_OPTIONS) == denoiser, name
        assert (name in CONDITIONAL_ENCODER_OPTIONS) == (conditional and not denoiser), name


def test_every_output_layer_has_test_options():
    assert set(OUTPUT_OPTIONS) == set(OUTPUT_LAYERS.names())
