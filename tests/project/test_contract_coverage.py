"""Every registered component is covered by the contract tests: a newly registered kind
without test options in ``conftest.py`` fails here (a test in ``conftest.py`` is never collected)."""

from __future__ import annotations

from conftest import (
    BIDIRECTIONAL_ENCODER_OPTIONS,
    CONDITIONAL_ENCODER_OPTIONS,
    DENOISER_ENCODER_OPTIONS,
    ENCODER_OPTIONS,
    OUTPUT_OPTIONS,
)

from targetlm.modules import ENCODERS, OUTPUT_LAYERS


def test_every_encoder_has_test_options():
    tables = (
        set(ENCODER_OPTIONS)
        | set(CONDITIONAL_ENCODER_OPTIONS)
        | set(DENOISER_ENCODER_OPTIONS)
        | set(BIDIRECTIONAL_ENCODER_OPTIONS)
    )
    assert tables == set(ENCODERS.names())
    for name in ENCODERS.names():  # each in the table of the contract tests that can run it
        encoder = ENCODERS.get(name)
        conditional, causal = encoder.conditional, encoder.causal
        denoiser = getattr(encoder, "denoiser", False)
        assert (name in DENOISER_ENCODER_OPTIONS) == denoiser, name
        assert (name in CONDITIONAL_ENCODER_OPTIONS) == (conditional and not denoiser), name
        # the causal LM contracts (causality, carried state, ensemble) run the causal kinds
        # only; a bidirectional kind runs the masked-LM contracts instead
        assert (name in ENCODER_OPTIONS) == (causal and not conditional), name
        assert (name in BIDIRECTIONAL_ENCODER_OPTIONS) == (not causal and not conditional), name


def test_every_output_layer_has_test_options():
    assert set(OUTPUT_OPTIONS) == set(OUTPUT_LAYERS.names())
