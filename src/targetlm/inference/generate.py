"""Sampling text from a model, one token at a time with the carried encoder state."""

from __future__ import annotations

import torch

from targetlm.data.vocab import Vocabulary
from targetlm.modules.model import LanguageModel

PROMPT_CHUNK = 32


@torch.no_grad()
def generate(
    model: LanguageModel,
    vocab: Vocabulary,
    prompt: list[str],
    max_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    device: str = "cpu",
) -> list[str]:
    """Continue ``prompt`` (words; unknown ones become ``<unk>``) with up to ``max_tokens`` words.

    The prompt is read after a context ``<eos>`` (a sentence start), exactly as in
    training and evaluation. ``temperature`` 0 picks the most likely word; ``top_k``
    > 0 samples among the k most likely only.
    """
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    generator = torch.Generator(device="cpu")
    if seed is not None:
        generator.manual_seed(seed)
    model.eval()
    ids = torch.tensor([[vocab.eos_id] + vocab.encode(prompt).tolist()], device=device)
    state = None
    for chunk in ids.split(PROMPT_CHUNK, dim=1):  # short chunks fit any encoder's window
        predicted, _, state = model(chunk, state, run_heads=False)
    words: list[str] = []
    for _ in range(max_tokens):
        logits = model.logits(predicted[0, -1]).float().cpu()  # (V,)
        if temperature == 0:
            token = int(logits.argmax())
        else:
            if top_k > 0:
                threshold = logits.topk(min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < threshold, float("-inf"))
            probs = torch.softmax(logits / temperature, -1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        words.append(vocab.itos[token])
        predicted, _, state = model(torch.tensor([[token]], device=device), state, run_heads=False)
    return words
