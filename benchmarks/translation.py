"""Translation throughput: targetlm's encoder–decoder against plain ``nn.Transformer``.

Both sides have the same shape (the ``nmt-tiny-multi30k`` preset by default: d 128, ff 256,
2 + 2 layers, 4 heads, V 6000; ``--shape small`` for the ``nmt-small`` one: d 512, ff 1024,
6 + 6): embedding size d, one embedding shared by source and target and tied to the output
layer (no bias), sinusoidal positions, inputs scaled by √d, post-LN, ReLU, dropout on the
residual branches and the inputs only: none on the attention weights nor after the
feed-forward ReLU (fairseq's and targetlm's defaults, ``attention_dropout`` =
``activation_dropout`` = 0), so the reference's ``nn.MultiheadAttention`` dropout is set to 0
and its layers' feed-forward ``dropout`` replaced by ``nn.Identity``. The reference gets the targetlm model's weights, and the script checks that both
compute the same logits and the same greedy outputs before it times anything.

* **training**: targetlm ``TranslationTask().predict`` + ``build_objective(cross_entropy,
  label_smoothing 0.1)`` + backward + Adam step; the reference ``nn.Transformer``
  (batch_first, post-LN, relu, no final LayerNorms: post-LN has none) + ``F.linear`` with the
  embedding + ``F.cross_entropy(label_smoothing=0.1, ignore_index)`` + backward + Adam. Same
  random batches (``targetlm.tasks.pair_batches``, 2,048-token budget, Multi30k-like lengths
  of 10–25 tokens), dropout 0.1. tokens/s = target tokens / s.
* **greedy decoding**: targetlm ``translate_ids`` (greedy, its KV cache) against a cached
  greedy decoder written here (``reference_greedy``: per decoder layer the projected keys and
  values of the target prefix grow by one position a step, the memory's are computed once,
  attention through ``F.scaled_dot_product_attention`` with the layer's own weights), and a
  second one that only caches the decoder layers' *inputs* and runs each layer's
  ``nn.MultiheadAttention`` modules with the new position as the query
  (``reference_greedy_mha``: it re-projects the whole prefix each step).
* **beam 5** (and beam 5 with the head ensemble, WDR heads n = 3, λ 0.5): targetlm only.

Every side decodes exactly ``--decode-len`` steps: the ``<eos>`` row of the shared embedding
is zeroed, so its logit is exactly 0 and never among the best candidates of a random model
(checked: every output has ``decode-len − 1`` tokens), and targetlm's maximum length is set
to ``--decode-len`` (``max_len_a = 0``), where it forces ``<eos>``.

Timing: one untimed warm-up per case and side, then rounds alternating the sides (ABBA…);
each side's rate is the median over rounds.

Usage::

    python benchmarks/translation.py [--shape tiny|small] [--steps 4] [--rounds 3]
        [--batch 64] [--decode-len 24] [--threads 1] [--no-ensemble] [--profile]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from common import LOAD_BEFORE, emit, interleaved, load_average, median, rate, spread
from torch import nn

from targetlm.config import ComponentConfig, ModelConfig
from targetlm.config import load as load_config
from targetlm.inference.translate import DecodeOptions, translate_ids
from targetlm.modules import build_model
from targetlm.objectives import build_objective
from targetlm.tasks import Batch, TranslationTask, pair_batches

IGNORE = -100
EOS = 2  # ids 0 (source padding) and 1 are never drawn; any fixed id would do
SEED = 1234
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SHAPES = {"tiny": "nmt-tiny-multi30k-base", "small": "nmt-small-multi30k-base"}  # --shape: preset
VOCAB = 6000  # both shapes: the tiny preset's BPE vocabulary


@dataclass(frozen=True)
class Shape:
    d: int
    ff: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    vocab: int
    max_context: int = 256


def preset_shape(name: str) -> Shape:
    """The model shape of ``--shape name``: its preset's d, ff, layers, heads and context."""
    config = load_config(CONFIGS / f"{SHAPES[name]}.toml")
    encoder = config.model.encoder.options
    return Shape(
        d=config.model.embedding.options["size"],
        ff=encoder["ff_size"],
        encoder_layers=encoder["encoder_layers"],
        decoder_layers=encoder["decoder_layers"],
        heads=encoder["num_heads"],
        vocab=VOCAB,
        max_context=encoder["max_context"],
    )


def model_config(shape: Shape, dropout: float, heads: str = "none") -> ModelConfig:
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": shape.d, "init_std": shape.d**-0.5}),
        encoder=ComponentConfig(
            "transformer_seq2seq",
            {
                "encoder_layers": shape.encoder_layers,
                "decoder_layers": shape.decoder_layers,
                "num_heads": shape.heads,
                "ff_size": shape.ff,
                "dropout": dropout,
                "max_context": shape.max_context,
                "norm": "post",
                "activation": "relu",
                "positions": "sinusoidal",
            },
        ),
        output=ComponentConfig("tied", {"bias": False}),
        heads=ComponentConfig(heads, {} if heads == "none" else {"n": 3}),
    )


def positions(length: int, d: int) -> torch.Tensor:
    """Sinusoidal positions (Vaswani et al.): sin on even, cos on odd dimensions."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(length, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table


class Reference(nn.Module):
    """Shared embedding -> ``nn.Transformer`` (post-LN, ReLU) -> tied output."""

    def __init__(self, shape: Shape, dropout: float) -> None:
        super().__init__()
        d = shape.d
        self.scale = math.sqrt(d)
        self.embedding = nn.Embedding(shape.vocab, d)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=shape.heads,
            num_encoder_layers=shape.encoder_layers,
            num_decoder_layers=shape.decoder_layers,
            dim_feedforward=shape.ff,
            dropout=dropout,
            activation="relu",
            batch_first=True,
            norm_first=False,
        )
        # post-LN stacks end with their last layer's LayerNorm: no extra final norm
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        for module in self.modules():
            if isinstance(module, nn.MultiheadAttention):  # none on the attention weights
                module.dropout = 0.0
            if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
                module.dropout = nn.Identity()  # none inside the feed-forward (after the ReLU)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("positions", positions(shape.max_context, d), persistent=False)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = ids.size(1)
        return self.drop(self.embedding(ids) * self.scale + self.positions[start : start + T])

    def encode(self, source: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.embed(source), src_key_padding_mask=~mask)

    def forward(self, source, mask, inputs) -> torch.Tensor:
        """Logits (B, T, V) of the target prefix ``inputs`` given the source."""
        T = inputs.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True: not allowed
        h = self.transformer(
            self.embed(source),
            self.embed(inputs),
            tgt_mask=causal,
            src_key_padding_mask=~mask,
            memory_key_padding_mask=~mask,
            tgt_is_causal=True,
        )
        return F.linear(h, self.embedding.weight)


@torch.no_grad()
def copy_weights(model: nn.Module, reference: Reference) -> None:
    """targetlm's parameters into the reference (same math: checked in ``check_same``)."""
    reference.embedding.weight.copy_(model.embedding.weight)
    t = model.encoder

    def attention(mha: nn.MultiheadAttention, ours) -> None:
        mha.in_proj_weight.copy_(ours.in_proj.weight)  # the same (q; k; v) layout
        mha.in_proj_bias.copy_(ours.in_proj.bias)
        mha.out_proj.weight.copy_(ours.proj.weight)
        mha.out_proj.bias.copy_(ours.proj.bias)

    def block(layer, ours, norms) -> None:
        layer.linear1.load_state_dict(ours.ff[0].state_dict())
        layer.linear2.load_state_dict(ours.ff[2].state_dict())
        for norm, theirs in zip(norms, ours.norms):
            norm.load_state_dict(theirs.state_dict())

    for layer, ours in zip(reference.transformer.encoder.layers, t.encoder_layers):
        attention(layer.self_attn, ours.attention)
        block(layer, ours, (layer.norm1, layer.norm2))
    for layer, ours in zip(reference.transformer.decoder.layers, t.decoder_layers):
        attention(layer.self_attn, ours.self_attention)
        attention(layer.multihead_attn, ours.cross_attention)
        block(layer, ours, (layer.norm1, layer.norm2, layer.norm3))


# --- reference decoding ---------------------------------------------------------------------


def _split(x: torch.Tensor, heads: int) -> torch.Tensor:
    B, L, d = x.shape
    return x.view(B, L, heads, d // heads).transpose(1, 2)


@torch.no_grad()
def reference_greedy(reference: Reference, source, mask, steps: int) -> torch.Tensor:
    """Greedy decoding of ``steps`` tokens with a KV cache: per decoder layer the projected
    self-attention keys/values of the prefix (grown by one position a step) and the
    cross-attention keys/values of the memory (computed once). (B, steps) token ids."""
    memory = reference.encode(source, mask)
    layers = reference.transformer.decoder.layers
    d = memory.size(-1)
    H = layers[0].self_attn.num_heads
    B = source.size(0)
    key_mask = mask[:, None, None, :]  # (B, 1, 1, S) True: attend
    memory_kv = []
    for layer in layers:
        w, b = layer.multihead_attn.in_proj_weight, layer.multihead_attn.in_proj_bias
        k, v = F.linear(memory, w[d:], b[d:]).chunk(2, -1)
        memory_kv.append((_split(k, H), _split(v, H)))
    cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(layers)
    token = torch.full((B, 1), EOS, dtype=torch.long)
    out = torch.empty(B, steps, dtype=torch.long)
    weight = reference.embedding.weight
    for t in range(steps):
        x = reference.embed(token, t)
        for i, layer in enumerate(layers):
            sa = layer.self_attn
            q, k, v = F.linear(x, sa.in_proj_weight, sa.in_proj_bias).chunk(3, -1)
            k, v = _split(k, H), _split(v, H)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            a = F.scaled_dot_product_attention(_split(q, H), k, v)
            x = layer.norm1(x + sa.out_proj(a.transpose(1, 2).reshape(B, 1, d)))
            ca = layer.multihead_attn
            q = _split(F.linear(x, ca.in_proj_weight[:d], ca.in_proj_bias[:d]), H)
            a = F.scaled_dot_product_attention(q, *memory_kv[i], attn_mask=key_mask)
            x = layer.norm2(x + ca.out_proj(a.transpose(1, 2).reshape(B, 1, d)))
            x = layer.norm3(x + layer.linear2(F.relu(layer.linear1(x))))
        token = F.linear(x[:, 0], weight).argmax(-1, keepdim=True)
        out[:, t] = token[:, 0]
    return out


@torch.no_grad()
def reference_greedy_mha(reference: Reference, source, mask, steps: int) -> torch.Tensor:
    """Greedy decoding that caches each decoder layer's *inputs* at the earlier positions and
    runs the layer's ``nn.MultiheadAttention`` modules on the new position (self-attention over
    the cached inputs, re-projected every step; cross-attention over the memory)."""
    memory = reference.encode(source, mask)
    layers = reference.transformer.decoder.layers
    B = source.size(0)
    cache: list[torch.Tensor | None] = [None] * len(layers)
    token = torch.full((B, 1), EOS, dtype=torch.long)
    out = torch.empty(B, steps, dtype=torch.long)
    weight = reference.embedding.weight
    for t in range(steps):
        x = reference.embed(token, t)
        for i, layer in enumerate(layers):
            cache[i] = x if cache[i] is None else torch.cat([cache[i], x], 1)
            a = layer.self_attn(x, cache[i], cache[i], need_weights=False)[0]
            x = layer.norm1(x + a)
            a = layer.multihead_attn(x, memory, memory, key_padding_mask=~mask, need_weights=False)
            x = layer.norm2(x + a[0])
            x = layer.norm3(x + layer.linear2(F.relu(layer.linear1(x))))
        token = F.linear(x[:, 0], weight).argmax(-1, keepdim=True)
        out[:, t] = token[:, 0]
    return out


# --- data, checks, timing -------------------------------------------------------------------


def random_pairs(count: int, vocab: int, seed: int) -> tuple[list, list]:
    """Sentence pairs of 10–25 tokens each side (the last one ``<eos>``; source length uniform,
    the target's within ±3 of it, as translations go), ids uniform in [3, V)."""
    g = torch.Generator().manual_seed(seed)

    def sentence(n: int) -> torch.Tensor:
        return torch.cat([torch.randint(3, vocab, (n - 1,), generator=g), torch.tensor([EOS])])

    source, target = [], []
    for _ in range(count):
        n = int(torch.randint(10, 26, (1,), generator=g))
        m = min(25, max(10, n + int(torch.randint(-3, 4, (1,), generator=g))))
        source.append(sentence(n))
        target.append(sentence(m))
    return source, target


def source_batch(sources: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """translate_ids' batch: sorted by length, padded with 0, mask True at real tokens."""
    rows = sorted(sources, key=len)
    source = nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    lengths = torch.tensor([len(r) for r in rows])
    return source, torch.arange(source.size(1))[None] < lengths[:, None]


@torch.no_grad()
def check_same(model, reference, batch: Batch, sources, decode_len: int) -> str:
    """Same logits (teacher forcing) and the same greedy outputs; returns a one-line summary."""
    model.eval(), reference.eval()
    ours = model.logits(TranslationTask().predict(model, batch).main)
    theirs = reference(batch.source, batch.source_mask, batch.inputs)
    real = batch.targets != IGNORE
    diff = (ours - theirs)[real].abs().max().item()
    options = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=decode_len)
    outputs = translate_ids(model, sources, options, EOS, batch_size=len(sources))
    source, mask = source_batch(sources)
    ordered = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    mine = torch.tensor([outputs[i] for i in ordered])
    assert mine.shape == (len(sources), decode_len - 1), "an output ended early"
    kv = reference_greedy(reference, source, mask, decode_len)[:, :-1]
    mha = reference_greedy_mha(reference, source, mask, decode_len)[:, :-1]
    same = (kv == mine).float().mean().item()
    same_mha = (mha == mine).float().mean().item()
    return (
        f"max |logit difference| {diff:.2e}; greedy tokens equal to targetlm's: "
        f"{same:.1%} (KV reference), {same_mha:.1%} (MHA reference)"
    )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--steps", type=int, default=8, help="training steps per round and side")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds per case and side")
    p.add_argument("--batch", type=int, default=64, help="sentences per decoding batch")
    p.add_argument("--decode-batches", type=int, default=4, help="decoding batches per round")
    p.add_argument("--decode-len", type=int, default=24, help="decoding steps per sentence")
    p.add_argument("--max-tokens", type=int, default=2048, help="training batch token budget")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-ensemble", action="store_true", help="skip beam 5 + head ensemble")
    p.add_argument("--profile", action="store_true", help="profile greedy decoding, both sides")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 step x 2 rounds, small decoding"
    )
    p.add_argument("--json-out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.batch, args.decode_batches = 1, 2, 8, 1
        args.decode_len = 8
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # the reference encoder's eval fast path (nested tensors) warns that they are a prototype
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
    torch.set_num_threads(args.threads)
    load = LOAD_BEFORE
    shape = preset_shape(args.shape)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}, {platform.processor() or '?'}, "
        f"{os.cpu_count()} cores, load average before the run {load:.2f}"
    )
    print(
        f"shape {args.shape}: d {shape.d}, ff {shape.ff}, {shape.encoder_layers}+"
        f"{shape.decoder_layers} layers, {shape.heads} heads, V {shape.vocab}; dropout "
        f"{args.dropout} (training); {args.steps} steps x {args.rounds} rounds; decoding "
        f"{args.decode_batches} batches of {args.batch} sentences x {args.decode_len} steps "
        "per round"
    )

    torch.manual_seed(SEED)
    model = build_model(model_config(shape, args.dropout), shape.vocab)
    with torch.no_grad():
        model.embedding.weight[EOS] = 0.0  # logit 0: never chosen (fixed output lengths)
    reference = Reference(shape, args.dropout)
    copy_weights(model, reference)

    source, target = random_pairs(max(400, args.steps * 100), shape.vocab, SEED)
    batches = pair_batches(source, target, EOS, max_tokens=args.max_tokens)
    batches = sorted(batches, key=lambda b: -b.inputs.numel())[: max(args.steps, 4)]
    tokens = [int((b.targets != IGNORE).sum()) for b in batches]
    sentences, _ = random_pairs(args.batch * args.decode_batches, shape.vocab, SEED + 1)
    print(check_same(model, reference, batches[0], sentences[: args.batch], args.decode_len))

    # --- training ---
    task = TranslationTask()
    objective = build_objective(ComponentConfig("cross_entropy", {"label_smoothing": 0.1}), model)
    adam = dict(lr=5e-4, betas=(0.9, 0.98))
    ours_opt = torch.optim.Adam(model.parameters(), **adam)
    ref_opt = torch.optim.Adam(reference.parameters(), **adam)

    def ours_step(b: Batch) -> None:
        prediction = task.predict(model, b)
        weight, bias = model.output()
        loss = objective(prediction, b.targets, weight, bias).loss
        ours_opt.zero_grad(set_to_none=True)
        loss.backward()
        ours_opt.step()

    def ref_step(b: Batch) -> None:
        logits = reference(b.source, b.source_mask, b.inputs)
        loss = F.cross_entropy(
            logits.flatten(0, 1), b.targets.reshape(-1), ignore_index=IGNORE, label_smoothing=0.1
        )
        ref_opt.zero_grad(set_to_none=True)
        loss.backward()
        ref_opt.step()

    def train(step: Callable[[Batch], None]) -> Callable[[], int]:
        def run() -> int:
            for i in range(args.steps):
                step(batches[i % len(batches)])
            return sum(tokens[i % len(batches)] for i in range(args.steps))

        return run

    model.train(), reference.train()
    for step in (ours_step, ref_step):  # warm-up
        step(batches[0]), step(batches[1])
    log("training")
    results: list[tuple[str, float, float | None]] = []
    r = interleaved({"t": rate(train(ours_step)), "r": rate(train(ref_step))}, args.rounds)
    results.append(("training tokens/s", median(r["t"]), median(r["r"])))
    spreads = {"training": r}

    # --- decoding ---
    model.eval(), reference.eval()
    # the trained weights again in both (training moved them apart), EOS row zero
    with torch.no_grad():
        model.embedding.weight[EOS] = 0.0
    copy_weights(model, reference)
    # translate_ids' batches: all sentences sorted by length, then cut every args.batch
    ordered = sorted(sentences, key=len)
    chunks = [source_batch(ordered[i : i + args.batch]) for i in range(0, len(ordered), args.batch)]
    n = len(sentences)

    def ours_decode(options: DecodeOptions, m=model) -> Callable[[], int]:
        def run() -> int:
            with torch.no_grad():
                outputs = translate_ids(m, sentences, options, EOS, batch_size=args.batch)
            assert all(len(o) == args.decode_len - 1 for o in outputs), "an output ended early"
            return n

        return run

    def ref_decode(decoder) -> Callable[[], int]:
        def run() -> int:
            for src, mask in chunks:
                decoder(reference, src, mask, args.decode_len)
            return n

        return run

    greedy = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=args.decode_len)
    beam = DecodeOptions(beam=5, max_len_a=0.0, max_len_b=args.decode_len)
    log("greedy decoding")
    sides = {
        "t": rate(ours_decode(greedy)),
        "kv": rate(ref_decode(reference_greedy)),
        "mha": rate(ref_decode(reference_greedy_mha)),
    }
    for side in sides.values():
        side()  # warm-up
    r = interleaved(sides, args.rounds)
    ours = median(r["t"])
    results.append(("greedy sentences/s (ref: K/V cache, SDPA)", ours, median(r["kv"])))
    results.append(("greedy sentences/s (ref: MHA over cached inputs)", ours, median(r["mha"])))
    spreads["greedy"] = r
    log("beam 5")
    r = interleaved({"t": rate(ours_decode(beam))}, max(1, args.rounds - 1), warmup=1)["t"]
    results.append(("beam 5 sentences/s", median(r), None))
    spreads["beam 5"] = {"t": r}
    if not args.no_ensemble:
        log("beam 5 + head ensemble")
        torch.manual_seed(SEED)
        with_heads = build_model(model_config(shape, args.dropout, "wdr"), shape.vocab)
        missing = with_heads.load_state_dict(model.state_dict(), strict=False)
        assert not missing.unexpected_keys
        with_heads.eval()
        ensemble = DecodeOptions(
            beam=5, max_len_a=0.0, max_len_b=args.decode_len, ensemble_lambda=0.5
        )
        side = rate(ours_decode(ensemble, with_heads))
        r = interleaved({"t": side}, max(1, args.rounds - 1), warmup=1)["t"]
        results.append(("beam 5 + ensemble (WDR n=3, λ 0.5) sentences/s", median(r), None))
        spreads["beam 5 + ensemble"] = {"t": r}

    print()
    print("| case | targetlm | reference | ratio |")
    print("|---|---:|---:|---:|")
    for case, ours, ref in results:
        if ref is None:
            print(f"| {case} | {ours:,.1f} | — | — |")
        else:
            print(f"| {case} | {ours:,.1f} | {ref:,.1f} | {ours / ref:.2f} |")
    print()
    for case, r in spreads.items():
        text = ", ".join(f"{side} {spread(v):.0%}" for side, v in r.items())
        print(f"spread (max − min) / median, {case}: {text}")
    print(f"load average after the run {load_average():.2f}")
    result = {
        "shape": args.shape,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "rounds": args.rounds,
        "cases": [
            {"case": case, "targetlm": ours, "reference": ref, "ratio": ref and ours / ref}
            for case, ours, ref in results
        ],
        "spread": {case: {side: spread(v) for side, v in r.items()} for case, r in spreads.items()},
    }
    samples = {f"{case} {side}": v for case, r in spreads.items() for side, v in r.items()}
    emit(result, args.json_out, samples=samples, ensure_ascii=False)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, run in (
            ("targetlm", ours_decode(greedy)),
            ("reference (K/V cache)", ref_decode(reference_greedy)),
        ):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run()
            print(f"\n--- profile: greedy decoding, {name} ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
