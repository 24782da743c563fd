"""Characters of words as ids: UTF-8 bytes plus markers, so no table depends on a vocabulary."""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD, BOW, EOW = 0, 1, 2  # padding, begin-of-word and end-of-word markers
NUM_CHARACTERS = 3 + 256  # the markers, then one id per byte value


def encode_characters(
    words: Sequence[str], max_length: int = 20, min_length: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Words -> character ids (N, L) padded with PAD, and lengths (N,) with the markers.

    Each word is ``BOW, bytes..., EOW``, its UTF-8 bytes cut to ``max_length - 2``
    (Józefowicz et al. 2016 cut at 50 bytes; word types of PTB/WikiText fit in 20
    except rare numbers and URLs). L is the longest word, at least ``min_length``
    (the widest convolution filter).
    """
    rows = [[BOW, *(b + 3 for b in w.encode("utf-8")[: max_length - 2]), EOW] for w in words]
    length = max([min_length, *(len(r) for r in rows)])
    ids = torch.tensor([r + [PAD] * (length - len(r)) for r in rows], dtype=torch.long)
    return ids.view(len(rows), length), torch.tensor([len(r) for r in rows], dtype=torch.long)
