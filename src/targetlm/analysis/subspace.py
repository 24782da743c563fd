"""Inan et al. (2017), Figure 1: how far apart the input and output embedding spaces end up.

Models trained with the analysis form of the augmented loss, ``β·τ²·|V|·J_aug + (1−β)·J``,
with unit-norm input embedding rows and an untied output layer. After training, the
distance between the column spaces of the input embedding ``L`` (|V|, d) and the output
embedding ``W`` (|V|, d) (:func:`targetlm.functional.subspace_distance`) shows the
augmented loss pulling ``W`` into the span of ``L``: about 1.0 at β = 0, about 0.06 at β = 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from targetlm import builders, functional
from targetlm.config import Config
from targetlm.modules.interfaces import EmbeddingTable
from targetlm.modules.model import LanguageModel
from targetlm.registry import ConfigError

Train = Callable[[Config, Path], tuple[LanguageModel, dict[str, Any]]]
"""Trains one run: ``(config, run_dir) -> (trained model, the run's results)``, the results
holding ``results["valid"]["ppl"]`` (the trainer's, passed in by the command that drives it)."""


def sweep(
    betas: Sequence[float], taus: Sequence[float], beta_tau: float
) -> list[tuple[float, float]]:
    """The paper's two panels: β sweep at τ = ``beta_tau``, then τ sweep at β = 1 (no duplicates)."""
    settings = [(beta, beta_tau) for beta in betas] + [(1.0, tau) for tau in taus]
    return list(dict.fromkeys(settings))


def run_configs(config: Config, settings: Sequence[tuple[float, float]]) -> list[Config]:
    """The config of each (β, τ) run, all checked before any model trains.

    Raises:
        ConfigError: ``config``'s objective is not ``augmented``, ``settings`` is empty, or a
            β or τ is out of the objective's range (one line naming it).
    """
    if config.objective.kind != "augmented":
        raise ConfigError(
            "the subspace analysis needs objective.kind = 'augmented', not "
            f"{config.objective.kind!r}"
        )
    if not settings:
        raise ConfigError("the subspace analysis needs at least one (β, τ) to train")
    configs = []
    for beta, tau in settings:
        run_config = config.replace([f"objective.beta={beta}", f"objective.tau={tau}"])
        builders.validate(run_config)
        configs.append(run_config)
    return configs


def run_subspace_analysis(
    config: Config,
    out_dir: str | Path,
    settings: Sequence[tuple[float, float]],
    train: Train,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Train one model per (β, τ) under ``out_dir`` with ``train`` and measure the subspace
    distance of each.

    ``config`` must use the ``augmented`` objective; its β and τ are replaced per run, every
    setting checked before the first run starts (:func:`run_configs`). The analysis does not
    train by itself: the caller passes the training (the command passes the trainer's).
    Writes ``subspace.json``, ``subspace.md`` and ``subspace.png`` into ``out_dir``.
    """
    out_dir = Path(out_dir)
    rows = []
    for (beta, tau), run_config in zip(settings, run_configs(config, settings)):
        run_dir = out_dir / f"beta{beta:g}-tau{tau:g}"
        log(f"training β = {beta:g}, τ = {tau:g} -> {run_dir}")
        model, results = train(run_config, run_dir)
        with torch.no_grad():
            embedding = model.embedding
            if not isinstance(embedding, EmbeddingTable):
                raise ValueError("the subspace analysis needs an input embedding with a table")
            input_table = embedding.table()
            output_table, _ = model.output()
            distance = float(functional.subspace_distance(input_table, output_table))
        rows.append(
            {"beta": beta, "tau": tau, "distance": distance, "valid_ppl": results["valid"]["ppl"]}
        )
        log(f"  distance {distance:.3f}, valid ppl {results['valid']['ppl']:.1f}")
    (out_dir / "subspace.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    lines = ["| β | τ | subspace distance | valid ppl |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {r['beta']:g} | {r['tau']:g} | {r['distance']:.3f} | {r['valid_ppl']:.1f} |"
        for r in rows
    ]
    (out_dir / "subspace.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot(rows, out_dir / "subspace.png")
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Two panels as in the paper: distance against β (at the sweep's τ) and against τ (at β = 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    beta_taus = {r["tau"] for r in rows if r["beta"] != 1.0}
    beta_tau = beta_taus.pop() if len(beta_taus) == 1 else None
    beta_rows = sorted(
        (r["beta"], r["distance"]) for r in rows if beta_tau is None or r["tau"] == beta_tau
    )
    tau_rows = sorted((r["tau"], r["distance"]) for r in rows if r["beta"] == 1.0)
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    if beta_rows:
        left.plot(*zip(*beta_rows), "o-")
    left.set_xlabel("β" + (f" (τ = {beta_tau:g})" if beta_tau is not None else ""))
    left.set_ylabel("subspace distance")
    if tau_rows:
        right.plot(*zip(*tau_rows), "o-")
    right.set_xlabel("τ (β = 1)")
    for axes in (left, right):
        axes.set_ylim(0, 1.05)
        axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
