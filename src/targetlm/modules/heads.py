r"""N-gram prediction heads (Heo, Rim & Choi 2024, 2025): predict words t+1..t+N−1 too.

Besides the main prediction ``x̂_t = h_t`` (the model's projected encoder output), head
n = 1..N−1 applies its own MLP to the same h_t. Every prediction goes through the shared
logit layer ``x̂ · E_outᵀ + b``, so heads own no softmax and work with any output layer.

Index convention. Column t reads inputs[:, t] and its main head predicts targets[:, t],
the next token of the stream; the paper's word x_t is the *target-side* word y_t, with
x_t = E_out[y_t]::

    column t            0    1    2    3    4    5
    inputs              #    a    b    c    d    e
    targets y_t         a    b    c    d    e    f
    main head at t=1    predicts y_1 = b                      x̂_1 = h_1
    head n=2 at t=1     predicts y_3 = d                      x̂_3 = MLP²(h_1) [+ Δ^r_2 x_1]
    WDR conjugate       from y_1, y_2 = b, c (x_t..x_{t+n−1}: the true words before y_{t+n})

In training the conjugate is a constant built from targets (``functional.wdr_conjugate``,
detached). In the ensemble head n at column t−n estimates y_t; its conjugate reads
y_{t−n}..y_{t−1}, which are inputs t−n+1..t: words already read (no future leak).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.modules.encoders import TransformerBlock
from targetlm.registry import ConfigError, Fraction, Range, Registry, Size

if TYPE_CHECKING:
    from targetlm.config import ComponentConfig
    from targetlm.modules.drafting import Drafter, DraftStart

HEADS: Registry[NgramHeads] = Registry("heads", context=("embedding_dim",))

# N: the WDR conjugate sums binomial(N, i)-weighted words, which overflow int64 from N = 67
MAX_HEADS = 64
HeadCount = Annotated[int, Range(1, MAX_HEADS, note="N counts the main head")]

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class NgramHeads(nn.Module):
    """Base: N−1 MLPs ``Linear(d, hidden) → activation → Linear(hidden, d)``, one per future word.

    ``residual = true`` adds the input, ``h_t + MLP^n(h_t)``, with the last Linear
    zero-initialised, so an untrained head's raw output is h_t, the main path's x̂_t (Medusa's
    start; a simple head then drafts what the main head would).

    The model runs them on its projected encoder output (``LanguageModel.forward`` returns
    their raw outputs in its ``Prediction``); what turns a raw output into a predicted target
    vector (``reconstruct``: the WDR conjugate) needs the true words, so the N-gram loss and
    the head ensemble call it. The loss weight α is the objective's (``objective.ngram_alpha``).

    Args:
        embedding_dim: d, the output layer's embedding size (supplied by the builder).
        n: N, the number of predicted positions including the main one (N = 1: no heads).
        hidden_size: the MLPs' hidden width (default d).
        activation: ``relu`` (the papers), ``tanh`` or ``gelu``.
        residual: add the input to each MLP's output, the last Linear starting at zero.

    Attributes:
        reads_words: whether ``reconstruct`` reads the words before the predicted one (WDR's
            conjugate); drafting then runs the heads one after another, else all at once.
        drafts: whether speculative decoding can draft with these heads.
        window: how many columns up to t the outputs at column t read (1: column t alone,
            the MLP heads; a transformer layer per head attends over its last ``window``
            columns). Drafting passes the heads the last ``window`` columns' main x̂ and, to
            ``reconstruct``, the words y of those columns (the read text, then the drafts).
        context: how many columns up to t drafting at t reads (their main x̂ and words): the
            window, or more for layers that read other layers' outputs over their windows.
    """

    reads_words: bool = False
    drafts: bool = True
    window: int = 1

    @property
    def context(self) -> int:
        return self.window

    def __init__(
        self,
        embedding_dim: int,
        n: HeadCount = 2,
        hidden_size: Size | None = None,
        activation: Literal["relu", "tanh", "gelu"] = "relu",
        residual: bool = False,
    ) -> None:
        self._begin(n, residual)
        d, hidden = embedding_dim, hidden_size or embedding_dim
        lasts = []
        self.mlps = nn.ModuleList()
        for _ in range(n - 1):
            first, act, last = nn.Linear(d, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, d)
            self.mlps.append(nn.Sequential(first, act, last))  # initialised in this order
            lasts.append(last)
        if residual:  # each head starts as the identity: its last layer outputs zeros
            for last in lasts:
                nn.init.zeros_(last.weight)
                nn.init.zeros_(last.bias)

    def _begin(self, n: int, residual: bool) -> None:
        """What every kind of heads starts with: the module's set-up, N checked (the main
        head counts) and kept, and whether the outputs add their input (a kind with layers
        of its own calls this instead of ``NgramHeads.__init__``)."""
        nn.Module.__init__(self)
        if n < 1:
            raise ValueError(f"n must be >= 1 (the main head counts), got {n}")
        self.num_predictions = n
        self.residual = residual

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """h (B, T, d) -> the heads' raw outputs MLP^n(h) (plus h when residual) stacked:
        (N−1, B, T, d)."""
        if self.residual:
            return torch.stack([hidden + mlp(hidden) for mlp in self.mlps])
        return torch.stack([mlp(hidden) for mlp in self.mlps])

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Raw outputs (N−1, B, T, d) at columns t -> predicted target vectors x̂_{t+n}, same shape.

        embeddings (B, L, d), L ≥ T: x_s = E_out[y_s] of the target-side words from the
        same first column (used by WDR only).
        """
        raise NotImplementedError

    def predict_at(self, outputs: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """Head n's x̂_{t+n} (B, d) at one column t, n = ``outputs.size(0)``, from heads 1..n's
        raw outputs there (n, B, d) and the word vectors x_t..x_{t+n−1} (B, n, d): what
        ``reconstruct`` gives there (drafting calls it once per drafted word, the drafts in
        place of the words not read)."""
        padded = F.pad(words, (0, 0, 0, 1))  # x_{t+n}: not needed, zeros
        return self.reconstruct(outputs[:, :, None], padded)[-1, :, 0]

    def drafter(self, start: DraftStart) -> Drafter:
        """Speculative decoding's drafter of these heads (``modules.drafting``): column t's."""
        from targetlm.modules.drafting import ColumnDrafter

        return ColumnDrafter(self, start)


@HEADS.register("simple")
class SimpleHeads(NgramHeads):
    """Simple N-gram heads (Heo et al. 2024): ``x̂_{t+n} = MLP^n(h_t)``."""

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return outputs


@HEADS.register("wdr")
class WdrHeads(NgramHeads):
    """WDR heads (Heo et al. 2025): head n predicts the n-level difference Δ_n x_t.

    ``x̂_{t+n} = MLP^n(h_t) + Δ^r_n x_t``, the conjugate built from the true words
    x_t..x_{t+n−1} and detached, so the head alone is trained towards ``Δ_n x_t``.
    """

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        T = outputs.size(2)
        conjugates = [
            functional.wdr_conjugate(embeddings, n)[:, :T] for n in range(1, outputs.size(0) + 1)
        ]
        return outputs + torch.stack(conjugates).to(outputs.dtype)

    def predict_at(self, outputs: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """Head n's raw output plus the conjugate of x_t..x_{t+n−1} at column t alone, summed
        as ``functional.wdr_conjugate`` sums it."""
        n = outputs.size(0)
        words = words.detach()
        conjugate = torch.zeros_like(words[:, 0])
        for i in range(1, n + 1):
            conjugate -= math.comb(n, i) * (-1) ** i * words[:, n - i]
        return outputs[-1] + conjugate.to(outputs.dtype)


class ResBlock(nn.Module):
    """Medusa's residual block ``x + SiLU(W x + b)`` (d -> d), W and b zero-initialised, so it
    starts as the identity."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


@HEADS.register("medusa")
class MedusaHeads(NgramHeads):
    """Medusa-1 heads (Cai et al. 2024): head n is ``num_layers`` residual blocks
    ``x + SiLU(W x + b)`` over h_t, read by the model's output layer (the shared unembedding):
    ``x̂_{t+n} = ResBlock^n(h_t)``. W starts at zero, so at step 0 every head is the identity
    of the main path (x̂_{t+n} = x̂_t) and drafts what the main head would.

    Args:
        embedding_dim: d (supplied by the builder).
        n: N, the number of predicted positions including the main one.
        num_layers: residual blocks per head (Medusa's default 1).
    """

    def __init__(self, embedding_dim: int, n: HeadCount = 2, num_layers: Size = 1) -> None:
        self._begin(n, residual=False)  # the blocks hold their own residual paths
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.mlps = nn.ModuleList(
            nn.Sequential(*(ResBlock(embedding_dim) for _ in range(num_layers)))
            for _ in range(n - 1)
        )

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return outputs


class WindowedBlocks(nn.Module):
    """One causal transformer layer per head (pre-norm self-attention and feed-forward, as the
    encoder's ``TransformerBlock``) whose query at column t attends to columns t−window+1..t
    only. The papers attend over the whole prefix; a window bounds the keys/values that
    drafting caches per row (``inference.drafters``: a step computes the new columns only).
    The attention output projection and the feed-forward's last Linear start at zero, so each
    block starts as the identity (x + 0)."""

    def __init__(
        self, count: int, d: int, num_heads: int, ff_size: int, window: int, dropout: float
    ) -> None:
        super().__init__()
        if d % num_heads:
            raise ValueError(
                f"embedding_dim {d} is not divisible by num_attention_heads {num_heads}"
            )
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.blocks = nn.ModuleList(
            TransformerBlock(d, num_heads, ff_size, dropout, "pre", "gelu") for _ in range(count)
        )
        for block in self.blocks:
            assert isinstance(block, TransformerBlock)
            last = block.ff[-1]
            assert isinstance(last, nn.Linear)
            for linear in (block.proj, last):
                nn.init.zeros_(linear.weight)
                nn.init.zeros_(linear.bias)

    def mask(self, columns: int, device: torch.device) -> torch.Tensor:
        """(T, T) bool: query i sees keys i−window+1..i."""
        offset = torch.arange(columns, device=device)
        distance = offset[:, None] - offset[None, :]
        return (distance >= 0) & (distance < self.window)

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Block ``index`` over x (B, T, d) -> (B, T, d)."""
        return self.blocks[index](x, mask=self.mask(x.size(1), x.device))[0]


class WindowedTransformerHeads(NgramHeads):
    """Base of the heads whose layers are windowed causal transformer blocks
    (:class:`WindowedBlocks`, one per head or depth, ``self.layers``).

    Args:
        embedding_dim: d (supplied by the builder).
        n: N, the number of predicted positions including the main one.
        num_attention_heads: attention heads per layer (must divide d).
        ff_size: the feed-forward width (default 4d).
        window: the columns each query attends to (itself included).
        dropout: on attention weights and residual branches.
    """

    layers: WindowedBlocks

    def __init__(
        self,
        embedding_dim: int,
        n: HeadCount = 2,
        num_attention_heads: Size = 4,
        ff_size: Size | None = None,
        window: Size = 16,
        dropout: Fraction = 0.0,
    ) -> None:
        self._begin(n, residual=False)
        self.window = window
        d, ff = embedding_dim, ff_size or 4 * embedding_dim
        self._build(d, partial(WindowedBlocks, n - 1, d, num_attention_heads, ff, window, dropout))

    def _build(self, d: int, layers: Callable[[], WindowedBlocks]) -> None:
        """Build the modules of this kind; ``layers()`` builds the blocks (called where their
        parameters are to be initialised among the kind's others)."""
        self.layers = layers()


@HEADS.register("gloeckle")
class ParallelTransformerHeads(WindowedTransformerHeads):
    """Gloeckle et al. 2024 ("Better & Faster Large Language Models via Multi-token
    Prediction", arXiv:2404.19737): head n is one transformer layer over the trunk's shared
    hidden states, ``x̂_{t+n} = Layer^n(x̂_{≤t})``, read by the model's output layer (the shared
    unembedding); the heads run in parallel and read no words. Their loss sums the heads'
    cross entropies with equal weights (configs/tf-small-ptb-gloeckle.toml).

    Each layer attends causally over its last ``window`` columns and starts as the identity
    (zero-initialised output projections: an untrained head drafts what the main head would).

    Args: those of :class:`WindowedTransformerHeads`.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """x̂ (B, T, d) -> each head's layer over it, (N−1, B, T, d)."""
        return torch.stack([self.layers(i, hidden) for i in range(self.num_predictions - 1)])

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return outputs

    def drafter(self, start: DraftStart) -> Drafter:
        """Incremental drafting, each layer's keys/values cached (``modules.drafting``)."""
        from targetlm.modules.drafting import GloeckleDrafter

        return GloeckleDrafter(self, start)


@HEADS.register("mtp")
class SequentialMtpHeads(WindowedTransformerHeads):
    """DeepSeek-V3's sequential multi-token prediction modules (DeepSeek-AI 2024, §2.2,
    arXiv:2412.19437). Depth k = 1..N−1 at column t::

        h'^k_t = W_k [RMSNorm(h^{k−1}_t) ; RMSNorm(Emb(y_{t+k−1}))]     (2d -> d)
        h^k    = TRM_k(h'^k)      one causal transformer block over the columns
        x̂_{t+k} = RMSNorm_k(h^k_t), read by the shared output layer

    with h^0 = the main x̂. Depth k sees the true word y_{t+k−1} in training (the word before
    its target, the one the main head or depth k−1 predicts) and the drafted one in decoding,
    so the heads ``reads_words`` and run in ``reconstruct``; ``forward`` only hands the main
    x̂ on (one view per depth, no copy). Emb is the target-side word vector x_s = E_out[y_s]
    that every head kind receives (DeepSeek-V3 shares the input embedding; with a tied output
    layer it is that table), detached. The loss weighs the depths' mean by λ
    (configs/tf-small-ptb-mtp.toml).

    Each block attends causally over its last ``window`` columns (the paper: the whole
    prefix), so drafting caches a bounded window of keys/values per depth
    (``inference.drafters``).

    Args: those of :class:`WindowedTransformerHeads` (N − 1 depths, one block each).
    """

    reads_words = True

    def _build(self, d: int, layers: Callable[[], WindowedBlocks]) -> None:
        depths = self.num_predictions - 1
        self.hidden_norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(depths))
        self.word_norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(depths))
        self.projections = nn.ModuleList(nn.Linear(2 * d, d, bias=False) for _ in range(depths))
        self.layers = layers()
        self.output_norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(depths))

    @property
    def context(self) -> int:
        """Columns up to t that exact incremental drafting (``inference.drafters``) reads at its
        start: depth k at column s reads depth k − 1 over s − window + 1..s, so the last of N − 1
        depths reaches (N − 1)(window − 1) columns back from each of the cached window − 1
        columns and the 2(N − 1) columns recomputed per step."""
        depths = self.num_predictions - 1
        return 2 * depths + self.num_predictions * (self.window - 1)

    def drafter(self, start: DraftStart) -> Drafter:
        """Incremental drafting, each depth's keys/values cached (``modules.drafting``)."""
        from targetlm.modules.drafting import MtpDrafter

        return MtpDrafter(self, start)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """x̂ (B, T, d) -> h^0 = x̂ for each depth, (N−1, B, T, d) (an expanded view)."""
        return hidden.unsqueeze(0).expand(self.num_predictions - 1, *hidden.shape)

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """``outputs`` (K, B, T, d): h^0 (its first entry; K ≤ N−1 depths are run) -> x̂_{t+k}
        of depths 1..K (K, B, T, d). embeddings (B, L, d): x_s of the words from the same first
        column; depth k at column t reads x_{t+k−1} (zeros past L)."""
        depths, _, columns, _ = outputs.shape
        needed = columns + depths - 1
        if embeddings.size(1) < needed:
            embeddings = F.pad(embeddings, (0, 0, 0, needed - embeddings.size(1)))
        hidden, predicted = outputs[0], []
        for k in range(depths):
            words = embeddings[:, k : k + columns].to(hidden.dtype)
            joined = torch.cat([self.hidden_norms[k](hidden), self.word_norms[k](words)], -1)
            hidden = self.layers(k, self.projections[k](joined))
            predicted.append(self.output_norms[k](hidden))
        return torch.stack(predicted)


def build_heads(config: ComponentConfig, embedding_dim: int) -> NgramHeads | None:
    """The configured heads, or None for ``kind = "none"`` (plain next-word training)."""
    if config.kind == "none":
        if config.options:
            raise ConfigError(
                f"model.heads: kind 'none' takes no options, got {', '.join(config.options)}"
            )
        return None
    return HEADS.build(config.kind, config.options, "model.heads", embedding_dim=embedding_dim)
