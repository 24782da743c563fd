"""Speculative decoding: every row's output is greedy decoding's for every head kind of the
registry, drafter and encoder (the Transformer's ragged KV cache, the LSTM's re-reads, the hf
backbone's smallest-row rule); each row keeps its own accepted length; the heads that start as
the identity; prompt lookup; bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import ENCODER_OPTIONS, encoder_params, model_config

from targetlm.config import ComponentConfig
from targetlm.data import Vocabulary
from targetlm.inference import drafters, speculative
from targetlm.inference.generate import GenerationError, generate, generate_batch
from targetlm.modules import HEADS, CausalTransformer, build_model, drafting
from targetlm.modules.heads import SimpleHeads
from targetlm.objectives import build_objective
from targetlm.runs import CheckpointError, load_state_into

V = 30
WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(V - 2)]
VOCAB = Vocabulary(WORDS, [1] * V)
PROMPTS = [["w1", "w2"], ["w3"], ["w4", "w5", "w6", "w7", "w8"], ["w9", "w10", "w11"]]
KINDS = sorted(HEADS.names())
# the kinds that draft, drawn from the registry: a new kind meets the contract tests unasked
DRAFTING = [kind for kind in KINDS if getattr(HEADS.get(kind), "drafts", False)]
LM_ENCODERS = encoder_params(sorted(ENCODER_OPTIONS))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def lm(
    encoder: str,
    heads: str = "none",
    n: int = 1,
    seed: int = 0,
    output: str = "tied",
    context: int = 24,
    **heads_options,
):
    """A tiny random eval-mode model; a Transformer's window (24) slides before 40 tokens."""
    options = {"max_context": context} if "max_context" in ENCODER_OPTIONS[encoder] else {}
    config = model_config(encoder, output, **options)
    if heads != "none":
        config = dataclasses.replace(
            config, heads=ComponentConfig(heads, {"n": n, **heads_options})
        )
    torch.manual_seed(seed)
    model = build_model(config, WORDS).eval()
    if heads != "none":  # random heads: identity-initialised ones would draft only repeats
        with torch.no_grad():
            for parameter in model.heads.parameters():
                parameter.normal_(0, 0.3)
    return model


def tokens(result):
    return [row.tokens for row in result.rows]


# --- the ragged KV cache --------------------------------------------------------------------


@pytest.mark.parametrize("context", [10, 64])
def test_ragged_rows_read_what_each_row_reads_alone(context):
    """Rows that drop different numbers of tokens after each read continue exactly as each
    row alone (rewound or re-read), before and after their windows (10) slide."""
    torch.manual_seed(0)
    encoder = CausalTransformer(
        input_size=8, num_layers=2, num_heads=2, ff_size=16, dropout=0.0, max_context=context
    ).eval()
    x = torch.randn(3, 40, 8)
    counts = [[1, 0, 2], [0, 2, 1], [2, 2, 0], [0, 0, 0], [1, 2, 0], [2, 1, 1], [0, 1, 2]]
    with torch.no_grad():
        _, state = encoder(x[:, :4])
        alone = [encoder(x[b : b + 1, :4])[1] for b in range(3)]
        position, re_read = [4, 4, 4], False
        for dropped in counts:
            segment = torch.stack([x[b, position[b] : position[b] + 3] for b in range(3)])
            before = state
            out, after = encoder(segment, before)
            for b in range(3):
                expected, read = encoder(segment[b : b + 1], alone[b])
                torch.testing.assert_close(out[b], expected[0], atol=1e-5, rtol=1e-5)
                rewound = encoder.rewind(read, dropped[b])
                keep = segment[b : b + 1, : 3 - dropped[b]]
                alone[b] = rewound if rewound is not None else encoder(keep, alone[b])[1]
            state = encoder.rewind_rows(after, torch.tensor(dropped))
            if state is None:  # a slid window: re-read each row from the saved state
                rows = [encoder.select_rows(before, torch.tensor([b])) for b in range(3)]
                keep = [segment[b : b + 1, : 3 - dropped[b]] for b in range(3)]
                state = encoder.concat_rows([encoder(k, r)[1] for k, r in zip(keep, rows)])
                re_read = True
            position = [p + 3 - d for p, d in zip(position, dropped)]
    assert re_read == (context == 10)  # only a slid window (no keys and values) is re-read


@pytest.mark.parametrize("context", [12, 64])
def test_hf_ragged_rows_read_what_each_row_reads_alone(context):
    """The hf backbone's rows of their own lengths (holes in the model's KV cache, per-row
    positions) continue as each row alone, through compaction and a sliding window (12)."""
    transformers = pytest.importorskip("transformers")
    from targetlm.modules.hf import HfEncoder

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    encoder = HfEncoder(transformers.LlamaModel(config), context).eval()
    x = torch.randn(3, 40, 16)
    counts = [[1, 0, 2], [0, 2, 1], [2, 2, 0], [0, 0, 0], [1, 2, 0], [2, 1, 1], [0, 1, 2]]
    with torch.no_grad():
        _, state = encoder(x[:, :4])
        alone = [encoder(x[b : b + 1, :4])[1] for b in range(3)]
        position = [4, 4, 4]
        for dropped in counts:
            segment = torch.stack([x[b, position[b] : position[b] + 3] for b in range(3)])
            out, after = encoder(segment, state)
            for b in range(3):
                expected, read = encoder(segment[b : b + 1], alone[b])
                torch.testing.assert_close(out[b], expected[0], atol=1e-5, rtol=1e-5)
                alone[b] = encoder.rewind(read, dropped[b])
            state = encoder.rewind_rows(after, torch.tensor(dropped))
            assert state is not None
            position = [p + 3 - d for p, d in zip(position, dropped)]
    assert state.mask is not None and state.length <= context
    if context == 64:  # no window slid: positions count from the first token
        assert state.positions.tolist() == position


# --- speculative = greedy -------------------------------------------------------------------


def _speculation_cases() -> list:
    """A batch of 4 (prompts of different lengths: each row keeps its own accepted length)
    for every encoder × head kind; a batch of 1 for every head kind, the encoder turning with
    it (so every encoder too), not the whole product again."""
    cases = [
        pytest.param(4, kind, *e.values, marks=e.marks) for kind in DRAFTING for e in LM_ENCODERS
    ]
    for i, kind in enumerate(DRAFTING):
        e = LM_ENCODERS[i % len(LM_ENCODERS)]
        cases.append(pytest.param(1, kind, *e.values, marks=e.marks))
    assert len(DRAFTING) >= len(LM_ENCODERS)  # else some encoder never decodes one row
    return cases


@pytest.mark.parametrize(("batch", "kind", "encoder"), _speculation_cases())
def test_speculative_decoding_equals_greedy(encoder, kind, batch):
    """Prompts of different lengths, random heads (mostly wrong: a wrongly accepted draft
    would change the text), the Transformer's window sliding before the end; the heads alone,
    and with prompt lookup (whose longer drafts make the heads' drafter follow rows that keep
    more tokens a step than it drafts) at batch 1 and on the Transformer at batch 4."""
    model = lm(encoder, kind, 4, seed=batch)
    prompts = PROMPTS[:batch]
    greedy = generate_batch(model, VOCAB, prompts, max_tokens=40, temperature=0)
    combined = batch == 1 or encoder == "transformer"
    for speculation in ("heads", "both") if combined else ("heads",):
        fast = generate_batch(model, VOCAB, prompts, 40, temperature=0, speculative=speculation)
        assert tokens(fast) == tokens(greedy)
        assert all(len(row) == 40 for row in tokens(fast))
        assert fast.stats is not None and fast.verifications > 0
        assert 0 <= fast.acceptance <= len(fast.stats.accepted_at)


@pytest.mark.parametrize("encoder", LM_ENCODERS)
@pytest.mark.parametrize(("drafter", "batch"), [("lookup", 1), ("lookup", 4), ("both", 4)])
def test_prompt_lookup_alone_and_with_heads_equals_greedy(encoder, drafter, batch):
    """A model without heads drafts by lookup; with heads, lookup where it matches (batch 1
    of every head kind with lookup: the contract test above)."""
    model = lm(encoder, "none" if drafter == "lookup" else "wdr", 3, seed=2)
    prompts = [p * 3 for p in PROMPTS][:batch]  # repeats give lookup matches
    greedy = generate_batch(model, VOCAB, prompts, max_tokens=30, temperature=0)
    fast = generate_batch(model, VOCAB, prompts, 30, temperature=0, speculative=drafter)
    assert tokens(fast) == tokens(greedy)
    assert fast.verifications > 0 and fast.acceptance > 0  # greedy text repeats itself


@pytest.mark.parametrize(
    ("encoder", "kind"),
    [pytest.param(*e.values, "medusa", marks=e.marks) for e in LM_ENCODERS]
    + [("transformer", k) for k in KINDS if k != "medusa"],
)
def test_stop_strings_and_max_tokens_inside_a_draft(encoder, kind):
    """Identity heads on a repeating model accept whole drafts, so rows end inside them; every
    other kind (random heads) gives greedy's rows with the same stop strings."""
    model = lm(encoder, kind, 4, seed=3)
    if kind == "medusa":  # identity-initialised again: drafts that greedy accepts
        for parameter in model.heads.parameters():
            torch.nn.init.zeros_(parameter)
    prompts = PROMPTS
    full = generate_batch(model, VOCAB, prompts, max_tokens=13, temperature=0)
    for speculate in ("heads", "lookup", "both"):
        fast = generate_batch(model, VOCAB, prompts, 13, temperature=0, speculative=speculate)
        assert tokens(fast) == tokens(full)
    stops = [row.tokens[4] for row in full.rows]  # a word of each continuation
    greedy = generate_batch(model, VOCAB, prompts, 13, temperature=0, stop=stops)
    fast = generate_batch(model, VOCAB, prompts, 13, temperature=0, stop=stops, speculative="heads")
    assert [(r.tokens, r.text, r.stopped) for r in fast.rows] == [
        (r.tokens, r.text, r.stopped) for r in greedy.rows
    ]
    assert any(r.stopped for r in fast.rows)


class Collected:
    """A stand-in for generate's rows: what each row got, call by call."""

    def __init__(self, rows: int, max_tokens: int) -> None:
        self.done = [False] * rows
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.calls: list[list[int]] = [[] for _ in range(rows)]
        self.max_tokens = max_tokens

    def add(self, row: int, ids) -> None:
        self.calls[row].append(len(ids))
        for token in ids:
            if not self.done[row]:
                self.ids[row].append(token)
                self.done[row] = len(self.ids[row]) >= self.max_tokens


class Oracle:
    """A drafter that proposes greedy's own continuation with a wrong token at a random column
    per row (or none): what the loop must keep of it is known in advance."""

    def __init__(self, truth, rows, length, rng) -> None:
        self.truth, self.rows, self.length, self.rng = truth, rows, length, rng
        self.alive = list(range(len(truth)))
        self.expected: list[list[int]] = [[] for _ in truth]
        self.accepted: list[list[int]] = [[] for _ in truth]

    def propose(self, first):
        drafts = []
        for b, row in enumerate(self.alive):
            at = len(self.rows.ids[row])
            proposal = list(self.truth[row][at : at + self.length + 1])
            assert proposal[0] == int(first[b])  # d_0 is greedy's own token
            wrong = int(torch.randint(1, self.length + 2, (1,), generator=self.rng))
            if wrong <= self.length:
                proposal[wrong] = (proposal[wrong] + 1) % V
            self.expected[row].append(wrong)  # tokens kept: d_0..d_{wrong−1}
            drafts.append(proposal)
        return torch.tensor(drafts)

    def accept(self, verified):
        assert verified.kept == verified.keep.tolist()
        assert [len(t) for t in verified.tokens] == verified.kept
        for b, row in enumerate(self.alive):
            self.accepted[row].append(verified.kept[b])

    def select(self, rows):
        self.alive = [self.alive[b] for b in rows.tolist()]


@pytest.mark.parametrize("encoder", LM_ENCODERS)
def test_each_row_keeps_its_own_accepted_length(encoder):
    """Any Drafter drives the loop: drafts from greedy's own continuation with a wrong token
    at a random column per row; every row keeps exactly its correct drafts (no smallest-row
    rule), the drafter is told so and follows the rows that leave at max_tokens, and the text
    is greedy's."""
    n, max_tokens = 4, 25
    model = lm(encoder, "simple", n, seed=1, context=64)  # every step drafts
    prompts = [["w1", "w2"], ["w3", "w4"], ["w5", "w6"]]
    greedy = generate_batch(model, VOCAB, prompts, max_tokens + 2 * n, temperature=0).rows
    truth = [VOCAB.encode(row.tokens).tolist() for row in greedy]
    rows = Collected(3, max_tokens)
    oracle = Oracle(truth, rows, n - 1, torch.Generator().manual_seed(0))
    ids = [[VOCAB.eos_id, *VOCAB.encode(p).tolist()] for p in prompts]
    with torch.no_grad():
        prediction = model(torch.tensor(ids), run_heads=False)
        stats = speculative.speculative_decode(
            model, *model.output(), prediction.main[:, -1], prediction.state, [3] * 3, rows, oracle
        )
    assert rows.ids == [t[:max_tokens] for t in truth]
    assert rows.calls == oracle.expected == oracle.accepted
    assert len({len(c) for c in rows.calls}) > 1  # the rows took different numbers of steps
    assert stats.accepted == sum(k - 1 for calls in oracle.expected for k in calls)
    # per position: the row-steps that kept draft i + 1
    steps = [k for calls in oracle.expected for k in calls]
    assert stats.accepted_at == [sum(k > i + 1 for k in steps) for i in range(n - 1)]


@pytest.mark.parametrize("kind", ["medusa", "gloeckle"])
def test_every_draft_reads_the_x_hat_of_the_last_accepted_column(kind, monkeypatch):
    """d_0 is greedy's token from the last column's x̂: the x̂ the heads draft from (the last of
    the window's columns, the incremental drafter's newest) gives it, step after step, row
    after row."""
    options = {"window": 3} if kind == "gloeckle" else {}
    model = lm("transformer", kind, 4, seed=5, context=64, **options)
    calls = []

    def record(last, first):
        calls.append((bool((model.logits(last).argmax(-1) == first).all()), last[0].clone()))

    if kind == "gloeckle":
        propose = drafting.GloeckleDrafter.propose

        def recording_propose(self, first):
            record(self.last, first)
            return propose(self, first)

        monkeypatch.setattr(drafting.GloeckleDrafter, "propose", recording_propose)
    else:
        original = drafting.draft

        def recording(heads, weight, bias, first, predicted, length, words=None):
            record(predicted if predicted.dim() == 2 else predicted[:, -1], first)
            return original(heads, weight, bias, first, predicted, length, words)

        monkeypatch.setattr(drafting, "draft", recording)
    generate_batch(model, VOCAB, PROMPTS, 20, temperature=0, speculative="heads")
    assert len(calls) > 3 and all(agrees for agrees, _ in calls)
    assert not torch.equal(calls[0][1], calls[-1][1])  # a new column's x̂ each step


def test_the_lstm_re_reads_each_group_of_rows_once(monkeypatch):
    """An encoder without rewind reads the kept tokens again from the saved state, one
    forward per distinct kept length."""
    model = lm("lstm", "simple", 4)
    reads = []
    forward = type(model).forward

    def counted(self, tokens, state=None, **kwargs):
        reads.append(tuple(tokens.shape))
        return forward(self, tokens, state, **kwargs)

    monkeypatch.setattr(type(model), "forward", counted)
    out = generate_batch(model, VOCAB, PROMPTS, 12, temperature=0, speculative="heads")
    assert out.acceptance < 3  # random heads: drafts rejected ...
    assert any(length < 4 for _, length in reads[1:])  # ... so short re-reads happened


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    from targetlm.config import ModelConfig

    del transformers
    config = {
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 48,
        "tie_word_embeddings": True,
    }

    def build(kind: str):
        torch.manual_seed(0)
        model_config = ModelConfig(
            backbone=ComponentConfig("hf", {"config": config}),
            heads=ComponentConfig(kind, {"n": 3}),
        )
        model = build_model(model_config, WORDS).eval()
        with torch.no_grad():
            for parameter in model.heads.parameters():
                parameter.normal_(0, 0.3)
        return model

    return build


@pytest.mark.parametrize("kind", KINDS)
def test_hf_backbone_speculation_equals_greedy(hf_model, kind):
    """Each row of the hf cache keeps its own accepted length (the rows' dropped tokens stay
    as masked holes); finished rows leave the batch. 50 tokens pass the window (48)."""
    model = hf_model(kind)
    assert speculative.per_row(model)
    greedy = generate_batch(model, VOCAB, PROMPTS, max_tokens=50, temperature=0)
    if kind == KINDS[0]:  # prompts of different lengths read at once: each row as alone
        for prompt, row in zip(PROMPTS, greedy.rows):
            assert generate(model, VOCAB, prompt, 50, temperature=0) == row.tokens
    for drafter in ("heads", "both"):
        fast = generate_batch(model, VOCAB, PROMPTS, 50, temperature=0, speculative=drafter)
        assert tokens(fast) == tokens(greedy)
        assert fast.verifications > 0
    short = generate_batch(
        model, VOCAB, PROMPTS, 50, temperature=0, stop=["w3"], speculative="heads"
    )
    stopped = generate_batch(model, VOCAB, PROMPTS, 50, temperature=0, stop=["w3"])
    assert tokens(short) == tokens(stopped)


# --- heads that start as the identity -------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "options"), [("medusa", {}), ("simple", {"residual": True}), ("gloeckle", {})]
)
def test_untrained_residual_heads_draft_what_the_main_head_would(kind, options):
    """At step 0 x̂_{t+n} = x̂_t: every draft repeats d_0."""
    torch.manual_seed(0)
    config = dataclasses.replace(
        model_config("transformer"), heads=ComponentConfig(kind, {"n": 4, **options})
    )
    model = build_model(config, WORDS).eval()
    prediction = model(torch.randint(V, (2, 5)))
    for n in range(3):
        torch.testing.assert_close(prediction.heads[n], prediction.main)
    weight, bias = model.output()
    first = model.logits(prediction.main[:, -1]).argmax(-1)
    drafted = drafting.draft(model.heads, weight, bias, first, prediction.main[:, -1], 3)
    assert torch.equal(drafted, first[:, None].expand(-1, 4))


@pytest.mark.parametrize("kind", ["gloeckle", "mtp"])
def test_window_drafts_are_what_the_heads_predict_over_the_whole_sequence(kind):
    """Drafting from the last `window` columns and the read words gives head 1's token of the
    training-time forward over the whole sequence (the true words in place of the drafts);
    the parallel heads give every head's."""
    torch.manual_seed(0)
    model = lm("transformer", kind, 4, context=64, window=3)
    inputs, targets = torch.randint(2, V, (2, 12)), torch.randint(2, V, (2, 15))
    targets[:, :11] = inputs[:, 1:]
    weight, bias = model.output()
    with torch.no_grad():
        prediction = model(inputs)
        vectors = model.heads.reconstruct(prediction.heads, weight[targets])  # (3, 2, 12, d)
        expected = model.logits(vectors).argmax(-1)  # (3, 2, 12): head n's token at column t
        for t in (0, 1, 7, 11):
            columns = prediction.main[:, max(0, t - 2) : t + 1]
            words = targets[:, max(0, t - 2) : t]
            drafted = drafting.draft(model.heads, weight, bias, targets[:, t], columns, 3, words)
            heads = 3 if kind == "gloeckle" else 1  # mtp's depth 2 reads the drafted d_1
            assert torch.equal(drafted[:, 1 : 1 + heads], expected[:heads, :, t].t())


def test_residual_false_keeps_todays_heads():
    torch.manual_seed(0)
    plain = SimpleHeads(8, 3)
    torch.manual_seed(0)
    residual = SimpleHeads(8, 3, residual=True)
    assert plain.mlps[0][-1].weight.abs().sum() > 0 and residual.mlps[0][-1].weight.sum() == 0
    h = torch.randn(2, 4, 8)
    torch.testing.assert_close(residual(h), h.expand(2, 2, 4, 8))


@pytest.mark.parametrize("kind", KINDS)
def test_every_head_kind_trains_with_the_ngram_loss_on_every_output(kind, output_kind):
    """The N-gram loss is finite and reaches every head parameter; the heads draft with the
    output layer's E_out and b (one drafted token per head)."""
    model = lm("lstm", kind, 3, output=output_kind).train()
    objective = build_objective(ComponentConfig("cross_entropy", {"ngram_alpha": 0.5}), model)
    inputs, targets = torch.randint(V, (2, 6)), torch.randint(V, (2, 8))
    out = objective(model(inputs), targets, *model.output())
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.heads.parameters())
    model.eval()
    with torch.no_grad():
        main = model(inputs).main[:, -1]
        weight, bias = model.output()
        first = model.logits(main).argmax(-1)
        drafted = drafting.draft(model.heads, weight, bias, first, main, 2)
    assert drafted.shape == (2, 3) and bool((drafted < V).all())


# --- prompt lookup --------------------------------------------------------------------------


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    lookup = drafters.PromptLookup([[5, 1, 2, 3, 9, 1, 2, 4, 7, 8]], max_ngram=3, min_ngram=1)
    assert lookup.propose(0, 1, 3) == [2, 4, 7]  # "1" last followed by 2 4 7
    lookup.append(0, [3, 1])
    assert lookup.propose(0, 2, 2) == [4, 7]  # "1 2" last at positions 5-6
    assert lookup.propose(0, 42, 3) == []
    lookup.append(0, [2, 3])  # text ... 3 1 2 3: "1 2 3" occurred at 1-3, followed by 9
    assert lookup.propose(0, 9, 2) == [1, 2]  # "2 3 9" at 2-4: followed by 1 2
    lookup.select([0])
    assert lookup.propose(0, 8, 5) == [3, 1, 2, 3, 8]  # "7 8" then the text's own end + d_0
    # ... and past the end the copy copies itself: the text repeats from the match
    assert lookup.propose(0, 8, 8) == [3, 1, 2, 3, 8, 3, 1, 2]


def test_prompt_lookup_drafts_a_loop_as_far_as_asked():
    lookup = drafters.PromptLookup([[7, 4, 5, 6, 4, 5, 6, 4]], max_ngram=3, min_ngram=1)
    # "4 5 6" ... "4" then d_0 = 5: the latest "4 5" is followed by 6 4 5 (the end), then on
    assert lookup.propose(0, 5, 7) == [6, 4, 5, 6, 4, 5, 6]
    assert lookup.propose(0, 9, 7) == []


def test_prompt_lookup_drafts_from_two_repeated_tokens_by_default():
    text = [5, 1, 2, 3, 9, 1]
    # d_0 = 9: only the single token "9" occurred before (then 1): no draft by default
    assert drafters.PromptLookup([text]).propose(0, 9, 3) == []
    assert drafters.PromptLookup([text], min_ngram=1).propose(0, 9, 3) == [1, 9, 1]
    # d_0 = 2: "1 2" occurred at 1-2, followed by 3 9 1
    assert drafters.PromptLookup([text]).propose(0, 2, 3) == [3, 9, 1]


def test_prompt_lookup_drafts_ten_tokens_by_default():
    """The measured best on SmolLM2-135M (benchmarks/lookup.py): 10 tokens a step, from the
    drafter and through generate_batch alike."""
    assert drafters.LOOKUP_TOKENS == 10
    lookup = drafters.LookupDrafter([[5, 6, 7, 5, 6, 7, 5]])
    assert lookup.propose(torch.tensor([6])).tolist() == [[6, 7, 5, 6, 7, 5, 6, 7, 5, 6, 7]]
    model = lm("transformer", context=64)
    prompts = [p * 3 for p in PROMPTS[:1]]
    out = generate_batch(model, VOCAB, prompts, 30, temperature=0, speculative="lookup")
    assert out.stats is not None and len(out.stats.accepted_at) == 10


# --- lookup and heads combined ---------------------------------------------------------------


class StubHeads:
    """A heads drafter that drafts ``tokens`` after every d_0 and records what it is told."""

    def __init__(self, tokens) -> None:
        self.tokens, self.length = list(tokens), len(tokens)
        self.proposed = self.accepted = 0
        self.selected: list[list[int]] = []

    def propose(self, first):
        self.proposed += 1
        return torch.tensor([[t, *self.tokens] for t in first.tolist()])

    def accept(self, verified):
        self.accepted += 1

    def select(self, rows):
        self.selected.append(rows.tolist())


def verified_step(drafted, kept):
    """A :class:`~targetlm.modules.drafting.Verified` in which row b kept ``kept[b]`` tokens."""
    keep = torch.tensor(kept)
    tokens = [drafted[b, :k].tolist() for b, k in enumerate(kept)]
    main = torch.zeros(*drafted.shape, 2)
    return drafting.Verified(drafted, main, keep, kept, tokens, main[:, 0], drafted[:, 0])


def test_the_combination_drafts_by_lookup_where_it_matches_and_by_the_heads_elsewhere():
    """Row 0's text has a match (lookup's 4 copied tokens, the heads not asked for it), row 1
    none (the heads' 2); rows padded with their own last token; every step reaches both."""
    heads = StubHeads([7, 8])
    lookup = drafters.LookupDrafter([[1, 2, 3, 4, 5, 1, 2], [9, 10, 11]], length=4)
    combined = drafters.CombinedDrafter(lookup, heads)
    assert combined.length == 4
    drafted = combined.propose(torch.tensor([3, 12]))
    assert drafted.tolist() == [[3, 4, 5, 1, 2], [12, 7, 8, 8, 8]]
    combined.accept(verified_step(drafted, [5, 1]))
    assert heads.proposed == heads.accepted == 1
    assert lookup.lookup.texts == [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [9, 10, 11, 12]]
    drafted = combined.propose(torch.tensor([3, 9]))  # row 1 ends "12 9": no match yet
    assert heads.proposed == 2
    combined.accept(verified_step(drafted, [1, 1]))
    # every row matching (row 1 ends "9 10" now): the heads draft nothing, but follow the rows
    drafted = combined.propose(torch.tensor([4, 10]))
    assert heads.proposed == 2 and drafted[1, 1:].tolist() == [11, 12, 9, 10]
    combined.accept(verified_step(drafted, [1, 1]))
    combined.select(torch.tensor([1]))
    assert heads.accepted == 3 and heads.selected == [[1]]


@pytest.mark.parametrize(("accepted", "drops"), [(0, True), (1, False)])
def test_the_heads_draft_on_only_while_their_acceptance_pays(accepted, drops):
    """Heads whose drafts keep fewer than HEADS_BREAK_EVEN tokens a step, judged after their
    trial, are dropped (lookup alone from then on: they draft, follow and select no more)."""
    heads = StubHeads([7, 8])
    lookup = drafters.LookupDrafter([[1], [2]], length=3)  # no match ever: the heads draft
    combined = drafters.CombinedDrafter(lookup, heads, trial=6)
    for step in range(3):  # 3 steps of 2 rows: the trial
        drafted = combined.propose(torch.tensor([20 + step, 30 + step]))
        assert drafted.size(1) == 3
        combined.accept(verified_step(drafted, [1 + accepted, 1 + accepted]))
    assert heads.accepted == (2 if drops else 3)  # dropped before the third step's accept
    drafted = combined.propose(torch.tensor([40, 50]))
    if drops:
        assert drafted.size(1) == 1 and heads.proposed == 3  # a plain greedy step
        combined.accept(verified_step(drafted, [1, 1]))
        combined.select(torch.tensor([0]))
        assert heads.selected == []
    else:
        assert drafted.size(1) == 3 and heads.proposed == 4


def test_the_combination_is_no_slower_than_the_better_drafter_in_forwards():
    """Identity heads on a model that repeats itself (the heads' drafts hold) and lookup on
    the same prompts: the combination takes no more body forwards than either alone."""
    model = lm("transformer", "medusa", 4, seed=3, context=256)
    for parameter in model.heads.parameters():  # identity heads again
        torch.nn.init.zeros_(parameter)
    forwards = {}
    for speculation in ("heads", "lookup", "both"):
        out = generate_batch(model, VOCAB, PROMPTS[:1], 60, temperature=0, speculative=speculation)
        forwards[speculation] = out.stats.forwards
    assert forwards["both"] <= min(forwards["heads"], forwards["lookup"])
    assert forwards["both"] < max(forwards["heads"], forwards["lookup"])


# --- bad input ------------------------------------------------------------------------------


def test_bad_speculative_input_is_one_clear_error():
    model = lm("transformer", "wdr", 3)
    with pytest.raises(GenerationError, match="--temperature 0"):
        generate_batch(model, VOCAB, PROMPTS, temperature=1.0, speculative="heads")
    with pytest.raises(GenerationError, match="one of heads, lookup, both"):
        generate_batch(model, VOCAB, PROMPTS, temperature=0, speculative="tree")
    with pytest.raises(GenerationError, match="max_context"):
        generate_batch(model, VOCAB, [["w1"] * 30], temperature=0, speculative="heads")
    with pytest.raises(GenerationError, match="lookup needs no heads"):
        generate_batch(lm("transformer"), VOCAB, PROMPTS, temperature=0, speculative="both")

    class Undraftable(SimpleHeads):
        drafts = False

    model.heads = Undraftable(16, 3)
    with pytest.raises(GenerationError, match="cannot draft"):
        generate_batch(model, VOCAB, PROMPTS, temperature=0, speculative="heads")
    # lookup alone needs no heads at all
    assert generate_batch(model, VOCAB, PROMPTS, 3, temperature=0, speculative="lookup").rows


def test_heads_trained_for_another_body_name_the_tensor_and_both_shapes():
    small, wide = lm("lstm", "medusa", 3), lm("lstm", "medusa", 3)
    wide.heads = HEADS.build("medusa", {"n": 3}, "model.heads", embedding_dim=24)
    with pytest.raises(CheckpointError, match=r"heads\.mlps\.0\.0\.linear\.weight is \(24, 24\)"):
        load_state_into(small, wide.state_dict(), VOCAB, "run")
    try:
        load_state_into(small, wide.state_dict(), VOCAB, "run")
    except CheckpointError as error:
        assert "(16, 16) here" in str(error) and "\n" not in str(error)


def test_cli_speculative_lookup_prints_the_greedy_text(tmp_path, capsys):
    from test_cli import assert_one_error, train_args

    from targetlm.cli import main

    run = tmp_path / "run"
    assert main(train_args(run)) == 0  # no heads: lookup needs none
    capsys.readouterr()
    args = ["generate", str(run), "--prompt", "the", "--max-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    greedy = capsys.readouterr().out
    assert main([*args, "--speculative", "lookup"]) == 0
    out, err = capsys.readouterr()
    assert out == greedy and "accepted per verification step" in err
    assert main([*args, "--speculative", "lookup", "--draft-tokens", "3"]) == 0
    assert capsys.readouterr().out == greedy
    rc = main([*args, "--speculative", "lookup", "--draft-tokens", "0"])
    assert rc == 2 and "--draft-tokens" in assert_one_error(capsys, rc)
    rc = main([*args, "--speculative", "tree"])
    assert rc == 2 and "one of heads, lookup, both" in assert_one_error(capsys, rc)
