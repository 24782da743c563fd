"""Generating text: batched prompts, greedy or sampled, stop strings, self-speculative decoding.

Each prompt is read after a context ``<eos>`` (a sentence start), exactly as in training and
evaluation, and every row is one stream with the encoder's carried state (the Transformer's
KV cache in eval mode), so each new token costs one forward of one token. Prompts of
different lengths are read in one forward, padded on the right, when the encoder's rows keep
their own lengths (:class:`~targetlm.modules.interfaces.RaggedEncoder`: the Transformer, the hf
backbone): each row then forgets its padding. Otherwise (the LSTM) their common length is
read in one forward, then every step reads one token per row, a prompt's own token while its
prompt lasts (forced) and the chosen one after it. Either way each row is exactly its prompt
followed by its continuation.

A next token is the argmax (temperature 0) or a sample of ``softmax(logits / temperature)``
restricted to the ``top_k`` most likely tokens and then to the nucleus (Holtzman et al. 2020:
the fewest most likely tokens whose probability reaches ``top_p``). A row ends after
``max_tokens`` tokens or when its decoded continuation contains a stop string (cut off there).
``speculative`` (greedy only) drafts with the N-gram heads, prompt lookup or both
(``inference/speculative.py``, ``inference/drafters.py``): the same output, fewer forwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from targetlm import functional
from targetlm.data.tokenizers import WhitespaceTokenizer
from targetlm.data.vocab import Vocabulary
from targetlm.inference.drafters import SPECULATIONS, Speculation, build_drafter
from targetlm.inference.progress import progress_bar
from targetlm.inference.speculative import SpeculativeStats, speculative_decode
from targetlm.modules.drafting import DraftStart
from targetlm.modules.interfaces import RaggedEncoder
from targetlm.modules.model import LanguageModel
from targetlm.registry import ConfigError

__all__ = ["Generation", "GenerationError", "Generations", "generate", "generate_batch"]


class GenerationError(ConfigError):
    """Generation options or prompts that cannot be used (one line, exit 2 from the CLI)."""


@dataclass(frozen=True)
class Generation:
    """One prompt's continuation.

    tokens: the generated tokens (up to the one that completed a stop string, included).
    text: their decoded text after the prompt's, cut before the first stop string.
    stopped: True when a stop string ended it (else it has ``max_tokens`` tokens).
    """

    tokens: list[str]
    text: str
    stopped: bool


@dataclass(frozen=True)
class Generations:
    """What :func:`generate_batch` made.

    rows: one :class:`Generation` per prompt, in order. seconds: the batch's wall time,
    reading the prompts included. acceptance: with ``speculative``, the mean number of drafted
    tokens a row accepted per verification step (0..k, averaged over the rows each step
    verified; None without speculation, or when no step drafted); verifications: how many
    steps drafted; stats: the speculative decoding's counts and timings (None without).
    """

    rows: list[Generation]
    seconds: float
    acceptance: float | None = None
    verifications: int = 0
    stats: SpeculativeStats | None = None


def restrict_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits (B, V) with -inf outside the support: the ``top_k`` largest (0: all), then the
    nucleus, the fewest largest whose probability reaches ``top_p`` (1: all; the most likely
    token always stays)."""
    if 0 < top_k < logits.size(-1):
        threshold = logits.topk(top_k, -1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if top_p < 1:
        ordered, order = logits.sort(-1, descending=True)
        probs = ordered.softmax(-1)
        before = probs.cumsum(-1) - probs  # the mass of the more likely tokens
        outside = before >= top_p
        outside[..., 0] = False  # (a top_p below float32's smallest value reads as 0)
        ordered = ordered.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, ordered)
    return logits


def next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token of every row (B,) from its logits (B, V): the argmax for temperature 0,
    else a sample (drawn on the CPU from ``generator``, so a seed gives the same tokens on
    every device)."""
    if temperature == 0:
        return logits.argmax(-1)
    scaled = logits.float() / temperature
    if not bool(torch.isfinite(scaled[logits.isfinite()]).all()):
        # so small a temperature that logits / temperature overflows: its limit, the argmax
        return logits.argmax(-1)
    probs = restrict_logits(scaled, top_k, top_p).softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(logits.device)


class _Continuations:
    """The tokens generated per row; a row ends at ``max_tokens`` or at a stop string."""

    def __init__(
        self,
        prompts: Sequence[Sequence[str]],
        vocab: Vocabulary,
        max_tokens: int,
        stop: Sequence[str],
    ) -> None:
        self.prompts = [list(p) for p in prompts]
        self.itos = vocab.itos
        self.decode: Callable[[Sequence[str]], str] = (
            vocab.tokenizer or WhitespaceTokenizer()
        ).decode
        self.max_tokens = max_tokens
        self.stop = [s for s in stop if s]
        self.tokens: list[list[str]] = [[] for _ in prompts]
        self.ids: list[list[int]] = [[] for _ in prompts]
        self.stopped = [False] * len(prompts)
        self.done = [False] * len(prompts)

    def add(self, row: int, ids: Sequence[int]) -> None:
        """Append ``ids`` to ``row`` until it ends."""
        for token in ids:
            if self.done[row]:
                return
            self.tokens[row].append(self.itos[token])
            self.ids[row].append(token)
            if self.stop and self._cut(row) is not None:
                self.done[row] = self.stopped[row] = True
            elif len(self.tokens[row]) >= self.max_tokens:
                self.done[row] = True

    @property
    def finished(self) -> bool:
        return all(self.done)

    def text(self, row: int) -> str:
        """The continuation's text (after the prompt's), including any stop string."""
        prompt = self.prompts[row]
        head, whole = self.decode(prompt), self.decode(prompt + self.tokens[row])
        return whole[len(head) :] if whole.startswith(head) else self.decode(self.tokens[row])

    def _cut(self, row: int) -> int | None:
        """Where the first stop string starts in the row's text (None: nowhere)."""
        text = self.text(row)
        found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def rows(self) -> list[Generation]:
        out = []
        for row, tokens in enumerate(self.tokens):
            text = self.text(row)
            cut = self._cut(row) if self.stopped[row] else None
            out.append(Generation(tokens, text if cut is None else text[:cut], self.stopped[row]))
        return out


def check_options(
    model: LanguageModel,
    prompts: Sequence[Sequence[str]],
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    speculative: str | None,
    draft_tokens: int | None = None,
) -> None:
    """Raise :class:`GenerationError` for options or prompts that cannot be generated from.
    ``speculative``: None, or what drafts (``heads``, ``lookup``, ``both``)."""
    if not prompts:
        raise GenerationError("no prompt to continue (give --prompt TEXT or --prompt-file FILE)")
    if max_tokens < 1:
        raise GenerationError(f"--max-tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise GenerationError(f"--temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise GenerationError(f"--top-k must be >= 0 (0: no limit), got {top_k}")
    if not 0 < top_p <= 1:
        raise GenerationError(f"--top-p must be in (0, 1], got {top_p}")
    if speculative is not None and speculative not in SPECULATIONS:
        raise GenerationError(
            f"--speculative must be one of {', '.join(SPECULATIONS)}, got {speculative!r}"
        )
    if draft_tokens is not None and draft_tokens < 1:
        raise GenerationError(f"--draft-tokens must be >= 1, got {draft_tokens}")
    if speculative in ("heads", "both") and model.num_heads < 1:
        raise GenerationError(
            f"--speculative {speculative} drafts with the N-gram heads, and this model has none "
            "(model.heads.kind = 'none' or n = 1; --speculative lookup needs no heads)"
        )
    if speculative in ("heads", "both") and model.heads is not None and not model.heads.drafts:
        raise GenerationError(
            f"--speculative {speculative}: heads of kind {type(model.heads).__name__} cannot "
            "draft (use --speculative lookup)"
        )
    if speculative and temperature != 0:
        raise GenerationError(
            f"--speculative is greedy decoding: it needs --temperature 0, got {temperature}"
        )
    context = model.encoder.max_context
    for i, prompt in enumerate(prompts, 1):
        if context is not None and len(prompt) + 1 > context:
            raise GenerationError(
                f"prompt {i} has {len(prompt)} tokens, and with its start <eos> the model "
                f"reads at most {context} (its max_context)"
            )


@torch.no_grad()
def generate_batch(
    model: LanguageModel,
    vocab: Vocabulary,
    prompts: Sequence[Sequence[str]],
    max_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    speculative: Speculation | None = None,
    device: str | torch.device = "cpu",
    draft_tokens: int | None = None,
) -> Generations:
    """Continue every prompt (its tokens; unknown words become ``<unk>``), all in one batch.

    ``temperature`` 0 is greedy; else samples restricted by ``top_k`` (0: no limit) and
    ``top_p`` (1: no limit), from a generator seeded with ``seed`` (None: a random seed).
    ``stop``: strings that end a row. ``speculative``: greedy speculative decoding drafted by
    ``"heads"`` (the model's heads), ``"lookup"`` (prompt lookup) or ``"both"`` (lookup where
    it matches, the heads elsewhere), needing temperature 0; the output is greedy decoding's.
    It starts once every prompt is read, and drafts as many tokens as fit into the encoder's
    ``max_context`` with every row's stream read so far, where reading them at once gives
    each the context it gets token by token; past that (a sliding window) it takes plain
    greedy steps. ``draft_tokens``: drafted tokens per step (default: each drafter's own, N − 1
    for the heads, 10 for lookup; the heads draft at most N − 1).
    Raises :class:`GenerationError` for unusable options (see :func:`check_options`).
    """
    check_options(model, prompts, max_tokens, temperature, top_k, top_p, speculative, draft_tokens)
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    model.eval()
    started = time.perf_counter()
    weight, bias = model.output()  # E_out (V, d), b (V,): once, every step reuses them
    rows = _Continuations(prompts, vocab, max_tokens, stop)
    ids = [[vocab.eos_id, *vocab.encode(list(p)).tolist()] for p in prompts]
    lengths = torch.tensor([len(i) for i in ids], device=device)  # (B,)
    longest, common = max(len(i) for i in ids), min(len(i) for i in ids)
    padded = torch.tensor([i + [vocab.eos_id] * (longest - len(i)) for i in ids], device=device)
    # the last columns' main x̂, for heads that attend over a window of columns while drafting
    heads_draft = speculative in ("heads", "both")
    window = model.heads.context if heads_draft and model.heads is not None else 1
    ragged = _read_prompts(model, padded, lengths, window)
    if ragged is not None:  # every prompt read, each row at its own length
        (last, state, history), read = ragged, longest
    else:  # the prompts' common length, then a column a step (columns read: ``read``)
        prediction = model(padded[:, :common], None, run_heads=False)
        last, state, history = (
            prediction.main[:, -1],
            prediction.state,
            prediction.main[:, -window:],
        )
        read = common
    stats = None
    with progress_bar(max_tokens, "tok", "generating") as bar:  # the longest row's tokens
        while not rows.finished:
            bar.update(max(len(t) for t in rows.tokens) - bar.n)
            if speculative is not None and read >= longest:  # all rows generating, each at
                # its own pace: speculative decoding takes over
                texts = [i + rows_ids for i, rows_ids in zip(ids, rows.ids)]
                start = DraftStart(weight, bias, texts, history, draft_tokens, model)
                drafter = build_drafter(speculative, start)
                read_counts = [len(t) for t in texts]
                stats = speculative_decode(
                    model, weight, bias, last, state, read_counts, rows, drafter
                )
                break
            logits = functional.logits(last, weight, bias)  # (B, V)
            chosen = next_tokens(logits, temperature, top_k, top_p, generator)  # (B,)
            for row, token in enumerate(chosen.tolist()):
                if read >= len(ids[row]):
                    rows.add(row, [token])
            if rows.finished:
                break
            if read < longest:  # rows still reading their prompt read its next token instead
                chosen = torch.where(read < lengths, padded[:, read], chosen)
            prediction = model(chosen[:, None], state, run_heads=False)
            last, state = prediction.main[:, -1], prediction.state
            if window > 1:
                history = torch.cat([history, prediction.main], 1)[:, -window:]
            read += 1
        bar.update(max(len(t) for t in rows.tokens) - bar.n)
    return Generations(
        rows.rows(),
        time.perf_counter() - started,
        None if stats is None else stats.acceptance,
        0 if stats is None else stats.steps,
        stats,
    )


def _read_prompts(
    model: LanguageModel, padded: torch.Tensor, lengths: torch.Tensor, window: int
) -> tuple[torch.Tensor, Any, torch.Tensor] | None:
    """Prompts of different lengths (``padded`` (B, L) on the right, ``lengths`` (B,)) read in
    one forward by an encoder whose rows keep their own lengths: every row then forgets its
    padding. Returns each row's last x̂ (B, d), the state and the x̂ of each row's last
    ``window`` columns (B, window, d; zeros before a row's first); None where the prompts
    have one length or the encoder cannot."""
    longest = padded.size(1)
    if bool((lengths == longest).all()) or not isinstance(model.encoder, RaggedEncoder):
        return None
    prediction = model(padded, None, run_heads=False)
    state = model.encoder.rewind_rows(prediction.state, longest - lengths)
    if state is None:
        return None
    columns = lengths[:, None] - window + torch.arange(window, device=padded.device)  # (B, w)
    history = prediction.main.gather(
        1, columns.clamp(min=0)[..., None].expand(-1, -1, prediction.main.size(2))
    )
    history = history.masked_fill((columns < 0)[..., None], 0.0)
    return history[:, -1], state, history


def generate(
    model: LanguageModel,
    vocab: Vocabulary,
    prompt: list[str],
    max_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    device: str = "cpu",
    *,
    top_p: float = 1.0,
    stop: Sequence[str] = (),
    speculative: Speculation | None = None,
) -> list[str]:
    """Continue one ``prompt`` (words; unknown ones become ``<unk>``): the generated tokens
    (:func:`generate_batch` with one prompt)."""
    result = generate_batch(
        model,
        vocab,
        [prompt],
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop,
        speculative,
        device,
    )
    return result.rows[0].tokens
