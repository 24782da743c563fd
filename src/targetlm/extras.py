"""The optional packages a config needs beyond targetlm's own dependencies.

A component built from an optional package raises one ConfigError naming what to install
when the package is absent (``model.encoder.kind = 'reformer' needs reformer-pytorch ...``).
:func:`needed` lists, for a whole config and before anything is built, the optional packages
its components need, each with the check its component runs: a caller (the tests over every
preset) can tell a config this environment cannot build from a broken one, and say what to
install.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from targetlm.config import Config


@dataclass(frozen=True)
class Extra:
    """An optional package a config needs.

    ``name`` is the option of ``scripts/setup.sh`` that installs it in a checkout
    (``--reformer``, ``--hf``); ``check`` says why it cannot be used here (the ConfigError
    message its component raises), or None where it can.
    """

    name: str
    check: Callable[[], str | None]

    def missing(self) -> str | None:
        return self.check()

    @property
    def setup(self) -> str:
        """The command that installs it in a checkout."""
        return f"bash scripts/setup.sh --{self.name}"


def needed(config: Config) -> list[Extra]:
    """The optional packages ``config``'s components need, installed or not."""
    from targetlm import pretrained
    from targetlm.modules import reformer

    extras = []
    if config.model.encoder.kind == "reformer":
        extras.append(Extra("reformer", reformer.missing))
    paths = []
    if config.model.backbone.kind == "hf":
        paths.append(config.model.backbone.options.get("path"))
    if config.data.tokenizer == "hf":
        paths.append(config.data.tokenizer_file)
    extras += [Extra("hf", partial(pretrained.missing, path)) for path in dict.fromkeys(paths)]
    return extras


def missing(config: Config) -> list[str]:
    """Why ``config`` cannot be built here for want of an optional package, one line each,
    with the command that installs it (empty: nothing is missing)."""
    reasons = []
    for extra in needed(config):
        reason = extra.missing()
        if reason is not None:
            reasons.append(f"{reason} (in a checkout: {extra.setup})")
    return reasons
