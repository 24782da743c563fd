"""Speculative decoding against KV-cached greedy decoding, batch 1 and batch 4.

Tokens/s of greedy generation of ``--new-tokens`` tokens after prompts from the test split,
for KV-cached greedy decoding and for speculative decoding drafted by the run's N-gram heads
(``heads``), by prompt lookup (``lookup``) and by both, at batch 1 (the first prompt) and
batch 4 (four prompts of different lengths, each row keeping its own accepted length). Every
variant's tokens are checked identical to greedy's. All variants of all models and thread
counts run in the same rounds: ``--rounds`` times in rotating order after one warm-up round;
the median is reported with the spread (min–max).

The models: trained runs (``--run DIR``, given once per run: a Transformer, LSTM or hf
backbone, with or without heads; each is its own model with its own greedy baseline), or
small pre-LN Transformers (d 128, 2 layers), one per kind of ``--heads`` (comma-separated
registry kinds, N = 4), each trained here for ``--train-steps`` steps on PTB when
``$TARGETLM_DATA`` holds it, else the synthetic corpus. ``--distill KIND[,KIND]``: heads of
each kind trained by self-distillation on the (first) body, as ``targetlm train-heads`` does
(``targetlm.training.distill``: ``--distill-steps`` steps on ``--distill-tokens`` tokens of
``--distill-corpus``), benchmarked beside the body's own heads (the same greedy baseline).
``--quick``: 300 training steps on the synthetic corpus (a small vocabulary: PTB's 10k-word
logit layer under the N-gram loss costs about a second a step), 64 new tokens, 3 rounds.

Peers (a run whose model is a Hugging Face backbone, ``model.backbone.kind = "hf"``): in the
same rounds, transformers' own ``generate`` on the same token ids (the prompts as the run's
vocabulary encodes them, after the same start ``<eos>``): greedy (``do_sample=False``, its
KV cache; ``hf greedy``) and prompt lookup decoding (``prompt_lookup_num_tokens=K``,
``--hf-lookup-tokens``, default 10; ``hf lookup``), at batch 1 and batch 4 (left padding and
an attention mask; prompt lookup is run at batch 4 only where transformers supports assisted
generation beyond batch 1, which the script checks and says). Their tokens are compared with
our greedy's (a count of differing rows, not an error: fp32 greedy agrees except for ties).

Per run: the parameters, the evaluation files beside it (``eval-valid.json`` and
``eval-test.json`` of ``targetlm eval RUN --split S --ensemble-lambda 0,0.2,0.4,0.6 --json``,
as ``experiments/common.sh`` writes them): main-head test perplexity (λ 0), the λ chosen on
valid and its test perplexity; and the drafting figures: accepted drafted tokens per step and
speed-up at batch 1 and 4 for the heads and, for reference, prompt lookup.

    python benchmarks/speculative.py --quick
    python benchmarks/speculative.py [--run DIR [--run DIR ...]] [--heads medusa,gloeckle,mtp]
                                     [--train-steps 1500]
                                     [--distill medusa,gloeckle,mtp --distill-steps 2000]
                                     [--new-tokens 128] [--rounds 5] [--threads 1,2]
                                     [--hf-lookup-tokens 10] [--lookup-tokens 4] [--json-out FILE]

The last stdout line is one JSON object (also written to ``--json-out``): ``identical``,
``speedup_b1`` and ``speedup_b4`` (the best drafter's median tokens/s over its body's greedy,
at the first thread count), ``accepted_per_step`` (that drafter's drafted tokens kept per row
and step at batch 1), ``runs`` (the per-model table), ``hf_peers`` (mismatches, whether prompt
lookup ran at batch 4), ``step_costs`` and the whole table under ``variants`` (one row per
thread count, model, batch and drafter; ``model`` names the run or the heads).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved, medians, timed  # noqa: E402
from generate import train_model  # noqa: E402

from targetlm.data import read_lines  # noqa: E402
from targetlm.inference import speculative  # noqa: E402
from targetlm.inference.drafters import window_drafter  # noqa: E402
from targetlm.inference.generate import generate_batch  # noqa: E402
from targetlm.modules.hf import HfEncoder  # noqa: E402
from targetlm.runs import load_run  # noqa: E402

DRAFTERS = ("heads", "lookup", "both")
PEERS = ("hf greedy", "hf lookup")
VERIFY_WIDTHS = (1, 2, 4, 8, 16)
LAMBDAS = "0,0.2,0.4,0.6"


@dataclass
class Entry:
    """One benchmarked model: its vocabulary, prompts and the label of the model whose greedy
    decoding is its baseline (itself, or the body of distilled heads)."""

    model: Any
    vocab: Any
    config: Any
    body: str
    prompts: list[list[str]]
    run: Path | None = None
    evaluation: dict[str, Any] = field(default_factory=dict)
    hf: Any = None  # the transformers model (an hf body only): the peers run on it

    @property
    def drafts(self) -> bool:
        heads = self.model.heads
        return self.model.num_heads > 0 and heads is not None and getattr(heads, "drafts", True)


def step_costs(model, vocab, prefix: int = 128, rounds: int = 20) -> dict[str, float]:
    """Batch 1 with a KV cache of ``prefix`` tokens: the median seconds of one forward over k
    new tokens for each k of VERIFY_WIDTHS (``verify_k``) and of drafting with the heads (their
    forward on one column and each head's argmax logit, ``draft``), measured in rotating order.
    A draft-verify step with k drafted tokens costs ``draft + verify_{k+1}`` and emits 1 + a
    tokens (a accepted), so it beats greedy (``verify_1`` a token) once
    ``a > (draft + verify_{k+1}) / verify_1 − 1``: the break-even acceptance.

    An hf backbone's cache is the model's own object, extended in place by every read: it is
    cropped back to ``prefix`` after each timed read (untimed), so every read sees the same
    cache."""
    context = getattr(model.encoder, "max_context", None)
    if context is not None:  # the cache and the widest verification fit the window
        prefix = min(prefix, context - max(VERIFY_WIDTHS))
    in_place = isinstance(model.encoder, HfEncoder)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(len(vocab), (1, prefix + max(VERIFY_WIDTHS)), generator=generator)
    with torch.no_grad():
        state = model(ids[:, :prefix], None, run_heads=False).state
        weight, bias = model.output()
        last = model(ids[:, prefix : prefix + 1], state, run_heads=False).main[:, -1:]
        if in_place:
            state = model.encoder.rewind(state, 1)

        def verify(k):
            return lambda: model(ids[:, prefix : prefix + k], state, run_heads=False)

        def undo(k):
            return (lambda: model.encoder.rewind(state, k)) if in_place else (lambda: None)

        window = model.heads.context if model.heads is not None else 1
        columns = model(ids[:, : prefix + 1], None, run_heads=False).main[:, -window:]
        words = ids[:, prefix + 2 - columns.size(1) : prefix + 1]
        first = model.logits(last[:, -1]).argmax(-1)
        length = model.num_heads
        if window > 1 and model.heads is not None:  # the heads' own cache (gloeckle, mtp)
            drafter = window_drafter(model.heads, weight, bias, columns, words, length)

            def draft():  # a step's proposal (the cache update of the kept columns not timed)
                return drafter.propose(first)
        else:

            def draft():  # what a decoding step drafts with: the heads on the last column
                return speculative.draft(model.heads, weight, bias, first, columns, length, words)

        parts = {f"verify_{k}": (verify(k), undo(k)) for k in VERIFY_WIDTHS}
        heads = model.heads
        if heads is not None and model.num_heads > 0 and getattr(heads, "drafts", True):
            parts["draft"] = (draft, lambda: None)

        def side(part, after):
            def run() -> float:
                seconds = timed(part, 1)
                after()  # untimed
                return seconds

            return run

        sides = {name: side(part, after) for name, (part, after) in parts.items()}
        # warm-up: the first reads of a new shape cost more
        times = interleaved(sides, rounds, warmup=3, order="rotate")
    return {"prefix": prefix, **medians(times)}


def prompts_from(config, vocab, count: int = 4, lengths=(16, 9, 24, 12)) -> list[list[str]]:
    """``count`` prompts of different lengths from the test split's first lines."""
    lines = [line for line in read_lines(config.data, config.data.test)[:200] if line.strip()]
    tokens = [t for t in vocab.tokenizer.tokenize(lines) if t != "<eos>"]
    prompts, start = [], 0
    for length in lengths[:count]:
        prompts.append(tokens[start : start + length])
        start += length + 37
    return prompts


def evaluation_of(run: Path) -> dict[str, Any]:
    """What a run directory says about its model: parameters (``results.json``), main-head test
    perplexity (λ 0) and the ensemble λ chosen on valid with its test perplexity, from
    ``eval-valid.json`` / ``eval-test.json`` (``targetlm eval --ensemble-lambda ... --json``)
    written after its checkpoint; without them, the test perplexity ``targetlm train`` wrote
    (``ppl_source`` says which)."""
    out: dict[str, Any] = {}
    if not run.is_dir():  # a config file: the model as built or published
        return out

    def read(name: str) -> dict[str, Any] | None:
        path = run / name
        try:
            return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            print(f"warning: {path} is unreadable; ignored")
            return None

    checkpoint = run / "best.pt"
    written = checkpoint.stat().st_mtime if checkpoint.is_file() else None

    def evaluated(split: str) -> dict[str, Any] | None:
        """eval-SPLIT.json, unless it is older than the checkpoint: then it describes another
        model (``targetlm train-heads`` copies the source run's files beside new heads)."""
        path = run / f"eval-{split}.json"
        if written is not None and path.is_file() and path.stat().st_mtime < written:
            print(f"note: {path} is older than {checkpoint.name}: ignored (evaluate again)")
            return None
        return read(path.name)

    results = read("results.json") or {}
    heads = read("heads.json")  # targetlm train-heads: the heads' own training
    if heads is not None:
        out["training"] = {"heads_steps": heads.get("steps"), "seconds": heads.get("seconds")}
        out["training"]["agreement"] = heads.get("agreement")
    elif "steps" in results:
        out["training"] = {"steps": results["steps"], "seconds": results.get("wall_time_s")}
    if "total_params" in results:
        out["params"] = results["total_params"]
        out["head_params"] = results.get("params", {}).get("heads", 0)
    valid, test = evaluated("valid"), evaluated("test")
    if test is not None:
        out["test_ppl"], out["ppl_source"] = test["ppl"], "eval-test.json"
    elif "test" in results:
        out["test_ppl"], out["ppl_source"] = results["test"]["ppl"], "results.json"
    if valid is not None and test is not None and valid.get("ensemble") and test.get("ensemble"):
        best = min(valid["ensemble"], key=lambda e: e["ppl"])
        at = {e["lambda"]: e["ppl"] for e in test["ensemble"]}
        out["lambda"], out["valid_ppl_lambda"] = best["lambda"], best["ppl"]
        out["test_ppl_lambda"] = at.get(best["lambda"])
        out["lambdas"] = sorted(at)
    return out


def distilled(model, config, vocab, kind: str, steps: int, tokens: int, corpus: str):
    """A copy of ``model`` sharing its body, with new ``kind`` heads (N = 4, or the body's own
    N) trained by self-distillation on ``tokens`` tokens of the ``corpus`` split."""
    from targetlm.config import ComponentConfig
    from targetlm.data import with_context_token
    from targetlm.modules.heads import build_heads
    from targetlm.training import distill

    n = model.heads.num_predictions if model.heads is not None else 4
    lines = read_lines(config.data, getattr(config.data, corpus))
    ids = with_context_token(vocab.encode(vocab.tokenizer.tokenize(lines)), vocab.eos_id)
    segment = 64
    ids = ids[: min(tokens, ids.numel()) // segment * segment].view(-1, segment)
    student = copy.copy(model)
    student._modules = dict(model._modules)
    torch.manual_seed(0)
    student.heads = build_heads(ComponentConfig(kind, {"n": n}), model.output.embedding_dim)
    for parameter in student.parameters():
        parameter.requires_grad_(False)
    for parameter in student.heads.parameters():
        parameter.requires_grad_(True)
    held = max(1, ids.size(0) // 10)
    started = time.perf_counter()
    train = distill.HiddenCache.build(student, ids[:-held])
    held_out = distill.HiddenCache.build(student, ids[-held:])
    distill.train_drafting_heads(student, train, steps, lr=1e-3, batch_size=8)
    with torch.no_grad():
        weight, bias = student.output()
    agreement = distill.head_agreement(student.heads, held_out, weight, bias)
    seconds = time.perf_counter() - started
    print(
        f"distilled {kind} heads: {steps} steps on {train.hidden.shape[0] * segment} tokens in "
        f"{seconds:.0f} s; held-out agreement " + ", ".join(f"{a:.2f}" for a in agreement)
    )
    training = {"heads_steps": steps, "seconds": seconds, "agreement": agreement}
    return student.eval(), training


def body_weights(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not k.startswith("heads.")}


def share_bodies(entries: dict[str, Entry]) -> None:
    """Runs whose bodies are the same weights (heads trained on one frozen body by ``targetlm
    train-heads``, one run per kind) are measured against the first such run's greedy
    decoding, on its modules (loaded once): only their heads differ."""
    bodies: list[tuple[str, dict[str, torch.Tensor]]] = []
    for label, entry in entries.items():
        weights = body_weights(entry.model)
        for first, theirs in bodies:
            if weights.keys() == theirs.keys() and all(
                weights[k].shape == theirs[k].shape and torch.equal(weights[k], theirs[k])
                for k in weights
            ):
                heads = entry.model.heads
                entry.model = copy.copy(entries[first].model)
                entry.model._modules = {**entries[first].model._modules, "heads": heads}
                # a body built without heads holds heads = None as a plain attribute, which
                # would hide the module entry: drop the copy's
                vars(entry.model).pop("heads", None)
                entry.body, entry.prompts = first, entries[first].prompts
                print(f"note: {label} has {first}'s body (the same weights): its baseline")
                break
        else:
            bodies.append((label, weights))


class Counter:
    """Counts the forwards of a module (a forward hook), for forwards per generation."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        module.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1


def hf_inputs(entry: Entry, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``batch`` prompts as our generation reads them (the start ``<eos>``, then the
    prompt's ids), left-padded, and their attention mask."""
    ids = [[entry.vocab.eos_id, *entry.vocab.encode(list(p)).tolist()] for p in entry.prompts]
    ids = ids[:batch]
    longest = max(len(i) for i in ids)
    pad = entry.vocab.eos_id
    tokens = torch.tensor([[pad] * (longest - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (longest - len(i)) + [1] * len(i) for i in ids])
    return tokens, mask


def hf_generate(entry: Entry, batch: int, new_tokens: int, lookup: int | None):
    """transformers' ``generate`` on the first ``batch`` prompts: greedy, with prompt lookup
    decoding of ``lookup`` tokens when given. The model's own end-of-text id is unset, so
    every row gets ``new_tokens`` tokens as ours do. Returns (seconds, ids of each row)."""
    tokens, mask = hf_inputs(entry, batch)
    options: dict[str, Any] = {
        "do_sample": False,
        "num_beams": 1,
        "max_new_tokens": new_tokens,
        "min_new_tokens": None,
        "eos_token_id": None,  # ours never stop early: neither may the peer
        "pad_token_id": entry.vocab.eos_id,
        "use_cache": True,
    }
    if lookup:
        options["prompt_lookup_num_tokens"] = lookup
    started = time.perf_counter()
    with torch.no_grad():
        out = entry.hf.generate(tokens, attention_mask=mask, **options)
    seconds = time.perf_counter() - started
    return seconds, out[:, tokens.size(1) :].tolist()


def hf_lookup_batches(entry: Entry, lookup: int) -> tuple[bool, str]:
    """Whether transformers runs prompt lookup decoding at batch > 1 (two prompts, two new
    tokens), and what it said if not."""
    try:
        hf_generate(entry, 2, 2, lookup)
    except ValueError as error:  # "assisted generate is only supported for batch_size = 1"
        return False, str(error).splitlines()[0]
    return True, ""


def parse_threads(text: str) -> list[int]:
    threads = [int(t) for t in text.split(",") if t.strip()]
    if not threads or min(threads) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return threads


def unique_label(path: Path, taken) -> str:
    """A run's label: its directory name (or a config file's stem), with its parent's name in
    front when another run already has it."""
    label = path.stem if path.is_file() else path.name
    if label in taken:
        label = f"{path.parent.name}/{label}"
    while label in taken:
        label += "'"
    return label


def trained(training: dict[str, Any] | None) -> str:
    """``1,500 steps, 52 min`` (the run's training), ``heads 1,500 steps, 52 min`` (heads trained
    on a frozen body), or nothing when unknown."""
    if not training:
        return ""
    steps = training.get("heads_steps", training.get("steps"))
    seconds = training.get("seconds")
    said = "heads " if "heads_steps" in training else ""
    said += "" if steps is None else f"{steps:,} steps"
    return said + ("" if seconds is None else f", {seconds / 60:.1f} min")


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run",
        type=Path,
        action="append",
        default=[],
        help="a trained run (or a config file: its model as built); give it once per run",
    )
    parser.add_argument(
        "--heads", default="medusa", help="head kinds of the models trained here (comma-separated)"
    )
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--distill", default="", help="head kinds to train by self-distillation")
    parser.add_argument("--distill-steps", type=int, default=1000)
    parser.add_argument("--distill-tokens", type=int, default=200_000)
    parser.add_argument("--distill-corpus", default="train")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=parse_threads,
        default=[1],
        help="thread counts, comma-separated (e.g. 1,2): all in the same interleaved rounds",
    )
    parser.add_argument(
        "--hf-lookup-tokens",
        type=int,
        default=10,
        help="transformers' prompt_lookup_num_tokens for the 'hf lookup' peer (hf runs)",
    )
    parser.add_argument(
        "--lookup-tokens",
        type=int,
        help="tokens our prompt lookup drafts per step (default: the decoder's, 4)",
    )
    parser.add_argument("--no-hf-peers", action="store_true", help="skip transformers' generate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path, help="write the result JSON here too")
    parser.add_argument("--quick", action="store_true", help="300 steps, 64 tokens, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.train_steps, args.new_tokens, args.rounds = 300, 64, 3
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load_before is not None and load_before >= 0.5:
        print(f"warning: load average {load_before:.1f} before the run: timings will be noisy")
    torch.set_num_threads(args.threads[0])
    context = 24 + 1 + args.new_tokens + 8  # the longest prompt, its <eos>, new tokens, a draft
    entries: dict[str, Entry] = {}
    with tempfile.TemporaryDirectory() as scratch:
        corpus = "synthetic" if args.quick else None
        if args.run:
            runs = args.run
        else:
            runs = [
                train_model(
                    args.train_steps, context, args.seed, Path(scratch) / f"run-{k}", k, corpus
                )
                for k in args.heads.split(",")
                if k
            ]
        for run in runs:
            config, vocab, model, _ = load_run(run)
            if args.run:
                label = unique_label(run, entries)
            else:
                label = type(model.heads).__name__ if model.heads is not None else "none"
            entries[label] = Entry(
                model.eval(),
                vocab,
                config,
                label,
                prompts_from(config, vocab),
                run if args.run else None,
                evaluation_of(Path(run)),
            )
    share_bodies(entries)
    body_label, body = next(iter(entries.items()))
    for kind in [k for k in args.distill.split(",") if k]:
        student, training = distilled(
            body.model,
            body.config,
            body.vocab,
            kind,
            args.distill_steps,
            args.distill_tokens,
            args.distill_corpus,
        )
        heads = sum(p.numel() for p in student.heads.parameters())
        label = f"{kind}-distilled"
        while label in entries:  # a run of that name was given
            label += "'"
        entries[label] = Entry(
            student,
            body.vocab,
            body.config,
            body_label,
            body.prompts,
            None,
            {"head_params": heads, "training": training},
        )
    for label, entry in entries.items():
        own, body_of = entry.evaluation, entries[entry.body].evaluation
        if "test_ppl" not in own and "test_ppl" in body_of:  # heads on a body: its main head
            own["test_ppl"], own["ppl_source"] = body_of["test_ppl"], f"{entry.body} (its body)"
        if "params" not in entry.evaluation:
            entry.evaluation["params"] = sum(p.numel() for p in entry.model.parameters())
        entry.evaluation["dtype"] = str(next(entry.model.parameters()).dtype).removeprefix("torch.")
        window = getattr(entry.model.encoder, "max_context", None)
        longest = max(len(p) for p in entry.prompts[:4]) + 1
        if window is not None and longest + args.new_tokens + entry.model.num_heads > window:
            print(
                f"note: {label}: prompt, {args.new_tokens} new tokens and a draft pass its "
                f"max_context {window}: past it the window slides and decoding takes plain "
                "greedy steps"
            )

    # the peers: transformers' own generate on an hf body
    hf_notes: dict[str, dict[str, Any]] = {}
    if not args.no_hf_peers:
        for label, entry in entries.items():
            if entry.body == label and isinstance(entry.model.encoder, HfEncoder):
                entry.hf = entry.model.encoder.pretrained[0].eval()
                batches, said = hf_lookup_batches(entry, args.hf_lookup_tokens)
                hf_notes[label] = {"lookup_batch4": batches, "lookup_batch4_error": said}
                if not batches:
                    import transformers

                    print(
                        f"note: transformers {transformers.__version__} runs prompt lookup "
                        f"decoding at batch 1 only ({said}): 'hf lookup' is measured at batch 1"
                    )
    counters = {}
    for entry in entries.values():
        module = entry.model.encoder
        module = module.body if isinstance(module, HfEncoder) else module
        if id(module) not in counters:
            counters[id(module)] = Counter(module)

    def counter_of(label: str) -> Counter:
        module = entries[label].model.encoder
        return counters[id(module.body if isinstance(module, HfEncoder) else module)]

    # the costs of one step's parts, per thread count
    costs: dict[int, dict[str, dict[str, float]]] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        costs[threads] = {}
        for label, entry in entries.items():
            c = step_costs(entry.model, entry.vocab)
            one = c["verify_1"]
            lookup = args.lookup_tokens or speculative.LOOKUP_TOKENS
            n_drafted = entry.model.num_heads if entry.drafts else lookup
            width = max(k for k in VERIFY_WIDTHS if k <= min(n_drafted + 1, max(VERIFY_WIDTHS)))
            c["draft_cost"] = c.get("draft", 0.0) / one
            c["break_even"] = c["draft_cost"] + c[f"verify_{width}"] / one - 1
            c["verify_width"], c["drafted"] = width, n_drafted
            costs[threads][label] = c
            print(
                f"\n{label}, {threads} thread(s): KV-cached forward over k new tokens (cache of "
                f"{c['prefix']}), against one ({one * 1e3:.2f} ms): "
                + ", ".join(f"k {k}: {c[f'verify_{k}'] / one:.2f}x" for k in VERIFY_WIDTHS[1:])
            )
            drafts = (
                f"drafting with the heads: {c['draft_cost']:.2f}x a token"
                if entry.drafts
                else "no drafting heads (prompt lookup's drafting is not timed here)"
            )
            print(
                f"{drafts}; break-even with {n_drafted} drafted tokens (verify {width}): "
                f"{c['break_even']:.2f} accepted per step"
            )

    variants = []  # (threads, batch, model label, drafter)
    for threads in args.threads:
        for b in (1, 4):
            for label, entry in entries.items():
                drafters = ["greedy", "lookup"] if entry.body == label else []
                if entry.drafts:
                    drafters += ["heads", "both"]
                if entry.hf is not None:
                    drafters.append("hf greedy")
                    if b == 1 or hf_notes[label]["lookup_batch4"]:
                        drafters.append("hf lookup")
                variants += [(threads, b, label, d) for d in drafters]

    def run_variant(threads: int, batch: int, label: str, drafter: str):
        entry = entries[label]
        torch.set_num_threads(threads)
        counter = counter_of(label)
        before = counter.count
        if drafter in PEERS:
            lookup = args.hf_lookup_tokens if drafter == "hf lookup" else None
            seconds, ids = hf_generate(entry, batch, args.new_tokens, lookup)
            tokens = [entry.vocab.decode(row) for row in ids]
            accepted = None
        else:
            result = generate_batch(
                entry.model,
                entry.vocab,
                entry.prompts[:batch],
                max_tokens=args.new_tokens,
                temperature=0,
                speculative=False if drafter == "greedy" else drafter,
                draft_tokens=args.lookup_tokens if drafter == "lookup" else None,
            )
            seconds, accepted = result.seconds, result.acceptance
            tokens = [r.tokens for r in result.rows]
        made = sum(len(t) for t in tokens)
        return made / seconds, tokens, accepted, counter.count - before

    outputs, acceptance, forwards = {}, {}, {}

    def side(v: tuple) -> Callable[[], float]:
        def run() -> float:
            speed, outputs[v], acceptance[v], forwards[v] = run_variant(*v)
            return speed

        return run

    started = time.perf_counter()
    sides = {v: side(v) for v in variants}
    speeds = interleaved(sides, args.rounds, warmup=1, order="rotate")
    seconds = time.perf_counter() - started

    def greedy_of(v: tuple) -> tuple:
        return (v[0], v[1], entries[v[2]].body, "greedy")

    def differing(v: tuple) -> list[int]:
        """Rows whose tokens differ from the body's greedy output, and the first position."""
        ours, theirs = outputs[greedy_of(v)], outputs[v]
        rows = []
        for a, b in zip(ours, theirs):
            if a != b:
                rows.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)))
        return rows

    ours = [v for v in variants if v[3] not in PEERS]
    identical = all(not differing(v) for v in ours)
    mismatches = {v: differing(v) for v in variants if v[3] in PEERS}
    median = medians(speeds)
    print(
        f"\n{args.new_tokens} new tokens, threads {','.join(map(str, args.threads))}, median of "
        f"{args.rounds} rounds (min-max), {seconds:.0f} s of rounds; our outputs identical to "
        f"greedy: {'yes' if identical else 'NO'}"
    )
    for v, rows in mismatches.items():
        if rows:
            print(
                f"note: {v[2]} {v[3]} at batch {v[1]}, {v[0]} thread(s): {len(rows)} of "
                f"{v[1]} rows differ from our greedy (first at token "
                f"{', '.join(map(str, rows))}): ties in fp32, or a difference to look into"
            )
    if hf_notes:
        print(
            "hf greedy / hf lookup: transformers' generate (greedy; prompt lookup with "
            f"prompt_lookup_num_tokens={args.hf_lookup_tokens}) on the same token ids; "
            "'vs hf greedy' is the speed over it"
        )
    print(
        "\n| threads | batch | model | drafter | tokens/s | min-max | vs greedy | vs hf greedy "
        "| accepted/step | forwards | same as greedy |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    table = []
    for v in variants:
        threads, b, label, d = v
        ratio = median[v] / median[greedy_of(v)]
        peer = (threads, b, label, "hf greedy")
        vs_hf = median[v] / median[peer] if peer in median else None
        low, high = min(speeds[v]), max(speeds[v])
        rows = differing(v)
        same = "yes" if not rows else f"{b - len(rows)}/{b}"
        print(
            f"| {threads} | {b} | {label} | {d} | {median[v]:.1f} | {low:.0f}-{high:.0f} | "
            f"{ratio:.2f}x | {fmt(vs_hf, suffix='x')} | {fmt(acceptance[v])} | {forwards[v]} | "
            f"{same} |"
        )
        table.append(
            {
                "threads": threads,
                "batch": b,
                "model": label,
                "drafter": d,
                "tokens_per_s": median[v],
                "spread": [low, high],
                "speedup": ratio,
                "speedup_vs_hf_greedy": vs_hf,
                "accepted_per_step": acceptance[v],
                "forwards": forwards[v],
                "differing_rows": len(rows),
            }
        )

    # the per-model table: quality and drafting side by side
    row_of = {(r["threads"], r["batch"], r["model"], r["drafter"]): r for r in table}
    runs_table = []
    any_hf = bool(hf_notes)
    for threads in args.threads:
        print(
            f"\nper model, {threads} thread(s): params, training (steps, minutes), main-head test "
            "ppl (lambda 0), the lambda chosen on valid and its test ppl, break-even acceptance "
            "(heads), accepted per step and speed-up over greedy (heads; prompt lookup for "
            "reference)"
        )
        header = (
            "| model | params | trained | test ppl | lambda | test ppl at lambda | break-even "
            "| heads acc b1 | heads b1 | heads acc b4 | heads b4 | lookup b1 | lookup b4 |"
        )
        rule = "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        if any_hf:
            header += " hf lookup b1 (vs hf greedy) |"
            rule += "---:|"
        print(header)
        print(rule)
        for label, entry in entries.items():
            e = entry.evaluation
            c = costs[threads][label]

            def cell(b: int, drafter: str, key: str, source: str = label, at: int = threads):
                row = row_of.get((at, b, source, drafter))
                return None if row is None else row[key]

            record = {
                "threads": threads,
                "model": label,
                "run": None if entry.run is None else str(entry.run),
                "body": entry.body,
                **e,
                "break_even": c["break_even"] if entry.drafts else None,
                "draft_cost": c["draft_cost"] if entry.drafts else None,
                "heads_accepted_b1": cell(1, "heads", "accepted_per_step"),
                "heads_speedup_b1": cell(1, "heads", "speedup"),
                "heads_accepted_b4": cell(4, "heads", "accepted_per_step"),
                "heads_speedup_b4": cell(4, "heads", "speedup"),
                "lookup_speedup_b1": cell(1, "lookup", "speedup", entry.body),
                "lookup_speedup_b4": cell(4, "lookup", "speedup", entry.body),
                "hf_lookup_speedup_b1": cell(1, "hf lookup", "speedup_vs_hf_greedy", entry.body),
            }
            runs_table.append(record)
            lam = e.get("lambda")
            line = (
                f"| {label} | {e.get('params', 0):,} | {trained(e.get('training'))} | "
                f"{fmt(e.get('test_ppl'))} | "
                f"{'' if lam is None else f'{lam:g}'} | {fmt(e.get('test_ppl_lambda'))} | "
                f"{fmt(record['break_even'])} | {fmt(record['heads_accepted_b1'])} | "
                f"{fmt(record['heads_speedup_b1'], suffix='x')} | "
                f"{fmt(record['heads_accepted_b4'])} | "
                f"{fmt(record['heads_speedup_b4'], suffix='x')} | "
                f"{fmt(record['lookup_speedup_b1'], suffix='x')} | "
                f"{fmt(record['lookup_speedup_b4'], suffix='x')} |"
            )
            if any_hf:
                line += f" {fmt(record['hf_lookup_speedup_b1'], suffix='x')} |"
            print(line)
        sources = {e.evaluation.get("ppl_source") for e in entries.values() if e.run is not None}
        if "results.json" in sources:
            print(
                "(test ppl from results.json where a run has no eval-test.json: run "
                f"`targetlm eval RUN --split S --ensemble-lambda {LAMBDAS} --json > "
                "RUN/eval-S.json` for S in valid, test, as experiments/common.sh does)"
            )

    # the goals, for each body: the best drafter of its model and of its distilled heads
    goals = []
    for threads in args.threads:
        for label, entry in entries.items():
            if entry.body != label:
                continue
            mine = [r for r in table if r["threads"] == threads and r["drafter"] not in PEERS]
            mine = [
                r for r in mine if entries[r["model"]].body == label and r["drafter"] != "greedy"
            ]
            if not mine:
                continue
            best = {
                b: max((r for r in mine if r["batch"] == b), key=lambda r: r["speedup"])
                for b in (1, 4)
            }
            hf_lookup = row_of.get((threads, 1, label, "hf lookup"))
            goal = {
                "threads": threads,
                "body": label,
                "best_b1": f"{best[1]['model']} {best[1]['drafter']}",
                "speedup_b1": best[1]["speedup"],
                "best_b4": f"{best[4]['model']} {best[4]['drafter']}",
                "speedup_b4": best[4]["speedup"],
                "met_b1": best[1]["speedup"] >= 1.5,
                "met_b4": best[4]["speedup"] >= 1.3,
                "hf_lookup_speedup_b1": hf_lookup and hf_lookup["speedup_vs_hf_greedy"],
            }
            if hf_lookup is not None:
                goal["met_vs_hf_lookup"] = best[1]["speedup"] >= goal["hf_lookup_speedup_b1"]
            goals.append(goal)
            said = (
                f"goals, {label}, {threads} thread(s): batch 1 {best[1]['speedup']:.2f}x "
                f"({goal['best_b1']}; >= 1.5x: {'met' if goal['met_b1'] else 'not met'}), "
                f"batch 4 {best[4]['speedup']:.2f}x ({goal['best_b4']}; >= 1.3x: "
                f"{'met' if goal['met_b4'] else 'not met'})"
            )
            if hf_lookup is not None:
                said += (
                    f", transformers' prompt lookup {goal['hf_lookup_speedup_b1']:.2f}x hf greedy "
                    f"at batch 1 (matched: {'yes' if goal['met_vs_hf_lookup'] else 'no'})"
                )
            print(said)

    first = args.threads[0]
    drafting = [
        r for r in table if r["drafter"] not in ("greedy", *PEERS) and r["threads"] == first
    ]
    best_b1 = max((r for r in drafting if r["batch"] == 1), key=lambda r: r["speedup"])
    first_costs = costs[first][body_label]
    one = first_costs["verify_1"]
    result = {
        "identical": identical,
        "speedup_b1": best_b1["speedup"],
        "speedup_b4": max(r["speedup"] for r in drafting if r["batch"] == 4),
        "accepted_per_step": best_b1["accepted_per_step"],
        "best_b1": f"{best_b1['model']} {best_b1['drafter']}",
        "heads": body_label,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "hf_lookup_tokens": args.hf_lookup_tokens,
        "lookup_tokens": args.lookup_tokens or speculative.LOOKUP_TOKENS,
        "verify_cost": {k: first_costs[f"verify_{k}"] / one for k in VERIFY_WIDTHS},
        "draft_cost": {label: c["draft_cost"] for label, c in costs[first].items()},
        "break_even_accepted": {label: c["break_even"] for label, c in costs[first].items()},
        "step_costs": {str(t): c for t, c in costs.items()},
        "hf_peers": {
            label: {
                **note,
                "mismatched_rows": {
                    f"{v[0]} threads, batch {v[1]}, {v[3]}": len(rows)
                    for v, rows in mismatches.items()
                    if v[2] == label
                },
            }
            for label, note in hf_notes.items()
        },
        "goals": goals,
        "runs": runs_table,
        "variants": table,
        "environment": {
            "argv": sys.argv[1:],
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds_of_rounds": seconds,
        },
    }
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out}")
    print(json.dumps(result))


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
