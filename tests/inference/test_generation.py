"""Generation: the Transformer's KV cache equals recomputing its window, rewinding a state,
sampling options, stop strings, and ``targetlm generate`` end to end on tiny trained runs
(speculative decoding: tests/inference/test_speculative.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import torch
from conftest import ENCODER_OPTIONS, model_config
from test_cli import assert_one_error, train_args

from targetlm.cli import main
from targetlm.config import ComponentConfig
from targetlm.data import Vocabulary
from targetlm.inference.generate import (
    GenerationError,
    generate,
    generate_batch,
    next_tokens,
    restrict_logits,
)
from targetlm.modules import CausalTransformer, build_model, detach_state, state_to_list
from targetlm.modules.interfaces import RewindableEncoder

# the module (the package exports the function of the same name)
generate_module = importlib.import_module("targetlm.inference.generate")
V = 30
WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(V - 2)]
VOCAB = Vocabulary(WORDS, [1] * V)
PROMPTS = [["w1", "w2"], ["w3"], ["w4", "w5", "w6", "w7", "w8"]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models are fastest on one thread (see tests/cli/test_cli.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def lm(encoder: str, heads: str = "none", n: int = 1, seed: int = 0, **options):
    """A tiny random eval-mode model; a Transformer's window is short, so generation slides it."""
    if "max_context" in ENCODER_OPTIONS[encoder]:
        options = {"max_context": 24, **options}
    config = model_config(encoder, "tied", **options)
    if heads != "none":
        config = dataclasses.replace(config, heads=ComponentConfig(heads, {"n": n}))
    torch.manual_seed(seed)
    return build_model(config, WORDS).eval()


# --- the KV cache ---------------------------------------------------------------------------


def transformer(norm: str = "pre", positions: str = "learned", context: int = 10):
    torch.manual_seed(0)
    return CausalTransformer(
        input_size=8,
        num_layers=2,
        num_heads=2,
        ff_size=16,
        dropout=0.0,
        max_context=context,
        norm=norm,
        positions=positions,
    ).eval()


def stream(encoder: CausalTransformer, x: torch.Tensor, segment: int, cache: bool):
    encoder.kv_cache = cache
    state, outputs = None, []
    for chunk in x.split(segment, 1):
        out, state = encoder(chunk, state)
        outputs.append(out)
    encoder.kv_cache = True
    return torch.cat(outputs, 1), state


@pytest.mark.parametrize("norm,positions", [("pre", "learned"), ("post", "sinusoidal")])
@pytest.mark.parametrize("segment", [1, 2, 3, 7])
def test_cached_transformer_equals_recomputing_the_window(norm, positions, segment):
    """Eval-mode outputs with the cache equal the old recomputation at every position, before
    and after the window (10) slides, for any segment length."""
    encoder = transformer(norm, positions)
    x = torch.randn(2, 33, 8)
    cached, _ = stream(encoder, x, segment, cache=True)
    recomputed, _ = stream(encoder, x, segment, cache=False)
    torch.testing.assert_close(cached, recomputed, atol=1e-5, rtol=1e-5)
    # until the window slides (the segments read so far fit into 10), segments equal one whole
    fits = 10 // segment * segment
    whole, _ = encoder(x[:, :fits])
    torch.testing.assert_close(cached[:, :fits], whole, atol=1e-5, rtol=1e-5)


def test_token_by_token_cache_equals_explicit_windows():
    """Past the slide every token is encoded from exactly the last max_context tokens."""
    encoder, context = transformer(), 10
    x = torch.randn(1, 25, 8)
    cached, _ = stream(encoder, x, 1, cache=True)
    for t in range(25):
        direct, _ = encoder(x[:, max(0, t - context + 1) : t + 1])
        torch.testing.assert_close(cached[:, t], direct[:, -1], atol=1e-5, rtol=1e-5)


def test_training_state_is_the_plain_window_and_eval_state_round_trips():
    encoder = transformer()
    x = torch.randn(2, 4, 8)
    encoder.train()
    out_train, state = encoder(x)
    assert isinstance(state, torch.Tensor) and state.shape == (2, 4, 8)
    encoder.eval()
    out_eval, state = encoder(x)
    torch.testing.assert_close(out_train, out_eval)  # no dropout: the same function
    window, keys_values = state
    assert window.shape == (2, 4, 8) and len(keys_values) == 2
    assert keys_values[0][0].shape == (2, 2, 4, 4)  # (B, heads, P, d/heads)
    more = torch.randn(2, 3, 8)
    expected, _ = encoder(more, state)
    for carried in (detach_state(state), state_to_list(state)):  # checkpoint-able structures
        torch.testing.assert_close(encoder(more, carried)[0], expected)


# --- rewinding ------------------------------------------------------------------------------


def test_rewinding_a_cached_state_equals_not_reading_the_tokens():
    encoder = transformer()
    assert isinstance(encoder, RewindableEncoder)
    assert not isinstance(lm("lstm").encoder, RewindableEncoder)
    x = torch.randn(2, 9, 8)
    _, read_six = encoder(x[:, :6])
    _, read_nine = encoder(x[:, 6:], read_six)
    rewound = encoder.rewind(read_nine, 3)
    for got, want in zip(state_to_list(rewound), state_to_list(read_six)):
        torch.testing.assert_close(got, want)
    follow = torch.randn(2, 2, 8)
    torch.testing.assert_close(encoder(follow, rewound)[0], encoder(follow, read_six)[0])
    # a slid window lost the tokens before it: no rewind
    _, slid = encoder(torch.randn(2, 4, 8), read_nine)
    assert isinstance(slid, torch.Tensor) and encoder.rewind(slid, 1) is None


# --- sampling, stop strings, options --------------------------------------------------------


def test_the_same_seed_gives_the_same_sample():
    model = lm("transformer")
    a = generate_batch(model, VOCAB, PROMPTS, max_tokens=20, seed=5)
    b = generate_batch(model, VOCAB, PROMPTS, max_tokens=20, seed=5)
    c = generate_batch(model, VOCAB, PROMPTS, max_tokens=20, seed=6)
    assert [r.tokens for r in a.rows] == [r.tokens for r in b.rows]
    assert [r.tokens for r in a.rows] != [r.tokens for r in c.rows]


@pytest.mark.parametrize("encoder", ["lstm", "transformer"])
def test_a_batch_row_is_its_prompt_alone(encoder):
    """The LSTM reads prompts of different lengths a column a step, the Transformer all at
    once, then drops each row's padding (its rows keep their own lengths)."""
    model = lm(encoder)
    batch = generate_batch(model, VOCAB, PROMPTS, max_tokens=12, temperature=0)
    for prompt, row in zip(PROMPTS, batch.rows):
        assert generate(model, VOCAB, prompt, 12, temperature=0) == row.tokens


def test_prompts_of_different_lengths_are_read_in_one_forward(monkeypatch):
    model = lm("transformer")
    widths = []
    forward = model.encoder.forward
    monkeypatch.setattr(
        model.encoder, "forward", lambda x, s=None: widths.append(x.shape[:2]) or forward(x, s)
    )
    generate_batch(model, VOCAB, PROMPTS, max_tokens=12, temperature=0)
    longest = 1 + max(len(p) for p in PROMPTS)  # <eos> and the prompt
    assert widths == [(3, longest)] + [(3, 1)] * 11  # then one token a step


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.05, 0.1, 0.15, 0.2, 0.5]]))
    kept = lambda **kw: torch.isfinite(restrict_logits(logits, **kw))  # noqa: E731
    assert kept(top_k=2).tolist() == [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]]
    assert kept(top_p=0.5).tolist() == [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    assert kept(top_p=0.8).tolist() == [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
    assert kept(top_k=2, top_p=0.9).tolist() == kept(top_k=2).tolist()
    assert kept(top_p=1.0).all()
    generator = torch.Generator().manual_seed(0)
    for options, support in (({"top_k": 3}, {0, 1, 2}), ({"top_p": 0.6}, {0, 1})):
        drawn = {
            int(next_tokens(logits[:1], 1.0, generator=generator, **options)) for _ in range(200)
        }
        assert drawn == support


def test_a_stop_string_ends_a_row_and_is_cut_off():
    model = lm("lstm", seed=3)
    full = generate_batch(model, VOCAB, PROMPTS, max_tokens=12, temperature=0).rows
    stops = [row.text[len(" ".join(row.tokens[:3])) :][:5] for row in full]  # from token 4
    stopped = generate_batch(model, VOCAB, PROMPTS, max_tokens=12, temperature=0, stop=stops)
    for prompt, before, after in zip(PROMPTS, full, stopped.rows):
        first = min(before.text.find(s) for s in stops if s in before.text)
        assert after.stopped and after.text == before.text[:first]
        assert after.tokens == before.tokens[: len(after.tokens)]
        # the last token completed a stop string: one token fewer does not stop
        assert len(after.tokens) > 1
        (shorter,) = generate_batch(
            model, VOCAB, [prompt], max_tokens=len(after.tokens) - 1, temperature=0, stop=stops
        ).rows
        assert not shorter.stopped


@pytest.mark.parametrize(
    "options,message",
    [
        ({"prompts": []}, "no prompt"),
        ({"max_tokens": 0}, "--max-tokens"),
        ({"top_p": 0.0}, "--top-p"),
        ({"top_p": 1.5}, "--top-p"),
        ({"top_k": -1}, "--top-k"),
        ({"temperature": -1.0}, "--temperature"),
        ({"prompts": [["w1"] * 30]}, "max_context"),
        ({"speculative": "heads"}, "N-gram heads"),
    ],
)
def test_bad_options_are_one_clear_error(options, message):
    model = lm("transformer")
    kwargs = {"prompts": PROMPTS, "temperature": 0.0, **options}
    with pytest.raises(GenerationError, match=message):
        generate_batch(model, VOCAB, **kwargs)


def test_speculative_sampling_is_refused():
    with pytest.raises(GenerationError, match="--temperature 0"):
        generate_batch(lm("lstm", "wdr", 2), VOCAB, PROMPTS, temperature=1.0, speculative="heads")


# --- targetlm generate ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def heads_run(tmp_path_factory) -> Path:
    """A tiny trained LSTM run with WDR heads (N = 3); read-only."""
    run = tmp_path_factory.mktemp("generate") / "heads"
    assert main(train_args(run, 'model.heads.kind="wdr"', "model.heads.n=3")) == 0
    return run


@pytest.fixture(scope="module")
def transformer_run(tmp_path_factory) -> Path:
    """A tiny trained Transformer run (max_context 16), without heads; read-only."""
    run = tmp_path_factory.mktemp("generate") / "transformer"
    encoder = [
        'model.encoder={kind="transformer", num_layers=1, num_heads=2, ff_size=32, '
        "max_context=16, dropout=0.0}"
    ]
    assert main(train_args(run, *encoder, "data.bptt=8")) == 0
    return run


def cli(capsys, run: Path, *args: str) -> tuple[str, str]:
    assert main(["generate", str(run), *args]) == 0
    return capsys.readouterr()


def test_cli_speculative_prints_the_greedy_text(heads_run, capsys):
    prompts = ["--prompt", "the", "--prompt", "a cat", "--max-tokens", "12", "--temperature", "0"]
    greedy, _ = cli(capsys, heads_run, *prompts)
    fast, err = cli(capsys, heads_run, *prompts, "--speculative")
    assert fast == greedy and greedy.startswith("the")
    assert "drafted tokens accepted per verification step" in err


def test_cli_json_and_prompt_file(heads_run, transformer_run, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the\n\na cat\n", encoding="utf-8")
    args = ["--prompt-file", str(prompts), "--max-tokens", "6", "--temperature", "0", "--json"]
    out, _ = cli(capsys, heads_run, *args, "--speculative")
    records = json.loads(out)
    assert [r["prompt"] for r in records] == ["the", "a cat"]
    assert {"text", "tokens", "tokens_per_s", "stopped", "acceptance"} <= records[0].keys()
    assert all(r["tokens"] <= 6 and r["tokens_per_s"] > 0 for r in records)
    plain, _ = cli(capsys, heads_run, *args)
    assert [r["text"] for r in json.loads(plain)] == [r["text"] for r in records]
    # the Transformer reads with its KV cache and slides past its window of 16
    sampled = ["--prompt-file", str(prompts), "--max-tokens", "30", "--seed", "1", "--top-p", "0.9"]
    out, _ = cli(capsys, transformer_run, *sampled)
    assert cli(capsys, transformer_run, *sampled)[0] == out
    assert len(out.split()) > 20  # two prompts and their continuations


def test_speculative_alone_is_greedy_decoding_and_help_shows_defaults(heads_run, capsys):
    """--speculative implies --temperature 0 (it is greedy decoding); an explicit sampling
    temperature with it is still refused. --help states the defaults."""
    args = ["--prompt", "the", "--max-tokens", "6", "--json"]
    (greedy,) = json.loads(cli(capsys, heads_run, *args, "--temperature", "0")[0])
    (fast,) = json.loads(cli(capsys, heads_run, *args, "--speculative")[0])
    assert fast["text"] == greedy["text"]
    assert main(["generate", str(heads_run), *args, "--speculative", "--temperature", "1"]) == 2
    assert "needs --temperature 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "(default: 30)" in capsys.readouterr().out  # --max-tokens


def test_a_vanishing_temperature_or_top_p_is_greedy_decoding(heads_run, capsys):
    """--temperature and --top-p as small as a float can be are their limits (the argmax), not
    a sampler error from logits / T overflowing or a nucleus emptied."""
    args = ["--prompt", "the", "--max-tokens", "8", "--seed", "1", "--json"]
    (greedy,) = json.loads(cli(capsys, heads_run, *args, "--temperature", "0")[0])
    for options in (["--temperature", "1e-300"], ["--top-p", "1e-300"]):
        (tiny,) = json.loads(cli(capsys, heads_run, *args, *options)[0])
        assert tiny["text"] == greedy["text"], options


def test_cli_stop_string(heads_run, capsys):
    args = ["--prompt", "the", "--max-tokens", "20", "--temperature", "0", "--json"]
    (full,) = json.loads(cli(capsys, heads_run, *args)[0])
    stop = full["text"].split()[2]  # the third generated word
    (cut,) = json.loads(cli(capsys, heads_run, *args, "--stop", stop)[0])
    assert cut["stopped"] and stop not in cut["text"]
    assert full["text"].startswith(cut["text"]) and cut["tokens"] <= 3


@pytest.mark.parametrize(
    "args,fragments",
    [
        ([], ("no prompt",)),
        (["--prompt", "the", "--max-tokens", "0"], ("--max-tokens",)),
        (["--prompt", "the", "--top-p", "1.5"], ("--top-p", "(0, 1]")),
        (
            ["--prompt", "the", "--speculative", "--temperature", "1"],
            ("--speculative", "--temperature 0"),
        ),
    ],
)
def test_cli_bad_input_is_one_error_line(heads_run, capsys, args, fragments):
    rc = main(["generate", str(heads_run), *args])
    assert rc == 2
    assert_one_error(capsys, rc, *fragments)


def test_cli_refuses_what_the_run_cannot_do(transformer_run, capsys):
    rc = main(["generate", str(transformer_run), "--prompt", "the " * 20])
    assert rc == 2 and "max_context" in assert_one_error(capsys, rc)
    rc = main(
        ["generate", str(transformer_run), "--prompt", "the", "--temperature", "0", "--speculative"]
    )
    assert rc == 2 and "N-gram heads" in assert_one_error(capsys, rc)
    assert capsys.readouterr().out == ""
