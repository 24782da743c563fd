"""t-SNE of target representations (Heo et al. 2025): word embeddings vs. their n-level WDRs.

The targets a model is trained on are ``x_t = E_out[y_t]`` for the main head and, for WDR
heads, ``Δ_n x_t`` (:func:`targetlm.functional.wdr`). Projecting a stretch of running text's
targets of every level into 2-D shows how much more diverse the WDR targets are.
Needs scikit-learn (``pip install -e ".[analysis]"`` in a checkout, as the README says).
"""

from __future__ import annotations

from pathlib import Path

import torch

from targetlm import functional
from targetlm.data.vocab import DataError
from targetlm.files import write_figure


def target_tsne(
    weight: torch.Tensor,
    ids: torch.Tensor,
    levels: list[int],
    perplexity: float = 30.0,
    seed: int = 0,
) -> dict[int, torch.Tensor]:
    """2-D t-SNE coordinates of the targets of each WDR level, embedded together.

    weight: E_out (V, d); ids (M,) the target words of a stretch of text; levels: n values
    (0: the word embeddings themselves). Returns ``{n: (M − n, 2)}``, level n keeping the
    positions where eq. (9) holds (t ≤ M − n).
    """
    try:
        from sklearn.manifold import TSNE
    except ImportError:
        raise DataError(
            'analyze tsne needs scikit-learn: pip install -e ".[analysis]" (in the targetlm checkout)'
        ) from None
    x = weight.detach().float()[ids][None]  # (1, M, d)
    parts = {n: functional.wdr(x, n)[0, : ids.numel() - n] for n in levels}
    stacked = torch.cat(list(parts.values())).double().numpy()
    points = TSNE(
        n_components=2,
        perplexity=min(perplexity, (len(stacked) - 1) / 3),
        init="pca",
        random_state=seed,
    ).fit_transform(stacked)
    out, start = {}, 0
    for n, part in parts.items():
        out[n] = torch.from_numpy(points[start : start + len(part)])
        start += len(part)
    return out


def plot_tsne(points: dict[int, torch.Tensor], path: Path, title: str) -> None:
    """Scatter plot of each level's points, in the format of ``path``'s suffix (.png, .pdf, .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 6))
    for n, xy in points.items():
        label = "word embeddings" if n == 0 else f"{n}-level WDR"
        axis.scatter(xy[:, 0], xy[:, 1], s=4, alpha=0.6, label=label)
    axis.set_title(title)
    axis.legend(markerscale=3)
    figure.tight_layout()
    write_figure(path, figure)
    plt.close(figure)
