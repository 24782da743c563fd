"""Incremental drafting (``modules.drafting``, built by ``heads.drafter``) equals recomputing
the heads for every row at every step: gloeckle's layers over the row's last ``window`` columns
(``drafting.draft``), MTP's depths over the whole text the row read (the training-time forward,
drafts after column t); batch 1 and 4, rows that keep different numbers of tokens (up to a
wider verification than the heads' own draft, as prompt lookup's in the combination), steps
without drafts, rows that leave."""

from __future__ import annotations

import pytest
import torch

from targetlm import functional
from targetlm.modules import drafting
from targetlm.modules.drafting import DraftStart, Verified
from targetlm.modules.heads import ParallelTransformerHeads, SequentialMtpHeads

D, V, N, WINDOW = 16, 40, 4, 8  # a window wider than the span MTP recomputes (6)
LENGTH = N - 1


def heads_of(kind: str):
    torch.manual_seed(0)
    cls = ParallelTransformerHeads if kind == "gloeckle" else SequentialMtpHeads
    heads = cls(D, N, window=WINDOW).eval()
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(0, 0.3)
    return heads, torch.randn(V, D), torch.randn(V)


def recomputed(kind, heads, weight, bias, columns, words, first, drafted):
    """Row by row (batch 1): the drafts the heads give at the row's last column."""
    rows = []
    for b in range(len(columns)):
        cols, ids = columns[b][None], torch.tensor(words[b], dtype=torch.long)[None]
        if kind == "gloeckle":  # the layers over the last window columns
            last = cols[:, -WINDOW:]
            window_words = ids[:, ids.size(1) - (last.size(1) - 1) :]
            draft = drafting.draft(
                heads, weight, bias, first[b : b + 1], last, LENGTH, window_words
            )
            rows.append(draft[0])
            continue
        # every depth over the whole text read, d_0 and the (incremental) drafts after it
        after = torch.cat([first[b : b + 1], drafted[b, 1:-1]])[None]
        vectors = heads.reconstruct(heads(cols), weight[torch.cat([ids, after], 1)])
        tokens = functional.logits(vectors[:, 0, -1], weight, bias).argmax(-1)
        rows.append(torch.cat([first[b : b + 1], tokens]))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", ["gloeckle", "mtp"])
@pytest.mark.parametrize(
    ("batch", "start", "wider"), [(1, 2, 0), (1, 40, 0), (4, 3, 0), (4, 30, 0), (4, 30, 5)]
)
def test_incremental_drafts_equal_recomputed_ones(kind, batch, start, wider):
    heads, weight, bias = heads_of(kind)
    generator = torch.Generator().manual_seed(batch * 100 + start)
    # each row's text: the main x̂ of its columns and the words read after them
    columns = [torch.randn(start, D, generator=generator) for _ in range(batch)]
    words = [torch.randint(V, (start - 1,), generator=generator).tolist() for _ in range(batch)]
    first = torch.randint(V, (batch,), generator=generator)
    # a wider verification (lookup's longer drafts) reaches further back: the whole text
    context = start if wider else heads.context
    with torch.no_grad():
        history = torch.stack(columns)[:, -context:]
        width = LENGTH + 1 + wider
        begin = DraftStart(weight, bias, words, history, LENGTH, width=width if wider else None)
        drafter = heads.drafter(begin)
        assert drafter.length == LENGTH
        alive = list(range(batch))
        for step in range(14):
            drafts = step % 5 != 3  # some steps verify d_0 alone (a full context)
            if drafts:
                drafted = drafter.propose(first)
                expected = recomputed(
                    kind,
                    heads,
                    weight,
                    bias,
                    [columns[r] for r in alive],
                    [words[r] for r in alive],
                    first,
                    drafted,
                )
                assert torch.equal(drafted, expected), step
                # other rows' longer drafts widen the verification: tokens past the heads'
                extra = torch.randint(V, (len(alive), wider), generator=generator)
                drafted = torch.cat([drafted, extra], 1)
            else:
                drafted = first[:, None]
            columns_read = drafted.size(1)
            keep = torch.randint(1, columns_read + 1, (len(alive),), generator=generator)
            verified = torch.randn(len(alive), columns_read, D, generator=generator)
            kept = keep.tolist()
            for b, row in enumerate(alive):  # the row reads its kept tokens, d_0 first
                columns[row] = torch.cat([columns[row], verified[b, : kept[b]]])
                words[row] += drafted[b, : kept[b]].tolist()
            predicted = verified[torch.arange(len(alive)), keep - 1]
            first = torch.randint(V, (len(alive),), generator=generator)
            tokens = [drafted[b, :k].tolist() for b, k in enumerate(kept)]
            drafter.accept(Verified(drafted, verified, keep, kept, tokens, predicted, first))
            if batch > 1 and step == 6:  # a row leaves
                staying = [0, 2, 3]
                drafter.select(torch.tensor(staying))
                alive, first = [alive[b] for b in staying], first[staying]


@pytest.mark.parametrize("kind", ["wdr", "simple", "mtp"])
def test_one_column_prediction_is_what_reconstruct_gives_there(kind):
    """``predict_at`` (drafting one column, head by head) equals ``reconstruct`` at that column
    exactly: WDR sums the conjugate in the same order."""
    from targetlm.modules import HEADS

    torch.manual_seed(0)
    heads = HEADS.build(kind, {"n": N}, "heads", embedding_dim=D).eval()
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(0, 0.3)
        raw = heads(torch.randn(3, 1, D))  # (N − 1, 3, 1, D): column t
        words = torch.randn(3, N, D)  # x_t..x_{t+N−1}
        for n in range(1, N):
            expected = heads.reconstruct(raw[:n], words[:, : n + 1])[-1, :, 0]
            assert torch.equal(heads.predict_at(raw[:n, :, 0], words[:, :n]), expected)
