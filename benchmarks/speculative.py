"""Speculative decoding against greedy decoding, ours and transformers', on one harness.

The arms, each at every ``--threads`` count and ``--batch`` size, all in the same rounds
(``common.interleaved``: every arm once a round, in rotating order, after a warm-up round):

    greedy          our KV-cached greedy decoding (every other arm's baseline)
    hf greedy       transformers' ``generate`` (greedy, its KV cache) on the same token ids
    hf lookup K     transformers' prompt lookup decoding, ``prompt_lookup_num_tokens`` K
                    for each K of ``--hf-lookup-tokens`` (default 3 and 10; at batch 4 only
                    where transformers runs assisted generation beyond batch 1)
    lookup          our prompt lookup (``--lookup-tokens``, default the decoder's own, 10)
    heads RUN       the drafting heads of ``--heads RUN`` (e.g. the EAGLE-style head trained
                    by ``targetlm train-heads``) on the body of ``--run``
    both RUN        prompt lookup and those heads combined (``--speculative both``)

The hf arms run where the body is a Hugging Face backbone. The prompts are ``--prompts``
stretches of the run's test split of different lengths; batch b generates them b at a time,
``--new-tokens`` tokens each. Per arm: tokens/s over wall time (median of the rounds, with
min–max) and over the process's CPU time, the speed-up over our greedy at the same threads and
batch (and over transformers' greedy), and, for our drafting arms, the drafted tokens accepted
per step, the acceptance per draft position (the share of a row's steps that kept draft i and
every one before it), the body's forwards, the cost of drafting and of a verification in
body steps (one body step: our greedy's seconds per forward, a token for each row, at the
same threads and batch) and the break-even they imply (a drafted step pays once its accepted tokens exceed
draft + verify − 1). Our arms' tokens are checked identical to our greedy's (an error
otherwise); transformers' rows that differ are counted (fp32 ties).

    python benchmarks/speculative.py --quick
    python benchmarks/speculative.py --run configs/smollm2-wt2-base.toml --heads RUN \\
        [--heads RUN ...] [--threads 1,2] [--batch 1,4] [--prompts 4] [--new-tokens 128] \\
        [--rounds 5] [--lookup-tokens 10] [--hf-lookup-tokens 3,10] [--json-out FILE]

``--quick``: a tiny random Llama body (transformers) with random ``mtp`` heads, 16 new tokens,
2 rounds, one thread: a smoke run of every arm. The last stdout line is ``JSON {...}``
(``common.emit``; also written to ``--json-out``): the arms' table under ``arms``, the command
and the versions, and the harness's record (load average before and after, every arm's rounds
as median and min–max).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    add_arguments,
    emit,
    interleaved,
    load_average,
    median,
    resolve_rounds,
    warn_if_loaded,
)

from targetlm.data import read_lines  # noqa: E402
from targetlm.inference.generate import generate_batch  # noqa: E402
from targetlm.inference.speculative import SpeculativeStats  # noqa: E402
from targetlm.modules.hf import HfEncoder  # noqa: E402
from targetlm.runs import load_run  # noqa: E402

LENGTHS = (16, 9, 24, 12, 20, 14, 30, 10)  # the prompts' lengths, in tokens, in turn


def prompts_from(config, vocab, count: int = 4, lengths=LENGTHS[:4]) -> list[list[str]]:
    """``count`` prompts of different lengths from the test split's first lines."""
    lines = [line for line in read_lines(config.data, config.data.test)[:200] if line.strip()]
    tokens = [t for t in vocab.tokenizer.tokenize(lines) if t != "<eos>"]
    prompts, start = [], 0
    for i in range(count):
        length = lengths[i % len(lengths)]
        prompts.append(tokens[start : start + length])
        start += length + 37
    return prompts


@dataclass
class Outcome:
    """One arm's generation of every prompt: each prompt's tokens and, for our speculative
    arms, the decoding's counts summed over the batches."""

    rows: list[list[Any]]
    stats: SpeculativeStats | None = None


@dataclass
class Arm:
    name: str
    threads: int
    batch: int
    run: Callable[[Sequence[Sequence[str]]], Outcome]  # one batch of prompts

    @property
    def key(self) -> str:
        return f"{self.name} | threads {self.threads} | batch {self.batch}"


def merged(parts: Sequence[SpeculativeStats | None]) -> SpeculativeStats | None:
    """The counts and timings of several decodings summed."""
    if not parts or any(p is None for p in parts):
        return None
    total = SpeculativeStats()
    for part in parts:
        assert part is not None
        total.add(part)
    return total


def ours(model, vocab, new_tokens: int, speculation: str | None, draft_tokens: int | None):
    """An arm's generation by ``generate_batch`` (greedy, or drafted by ``speculation``)."""

    def run(prompts: Sequence[Sequence[str]]) -> Outcome:
        made = generate_batch(
            model,
            vocab,
            prompts,
            max_tokens=new_tokens,
            temperature=0,
            speculative=speculation,  # type: ignore[arg-type]
            draft_tokens=draft_tokens if speculation == "lookup" else None,
        )
        return Outcome([row.tokens for row in made.rows], made.stats)

    return run


def transformers_generate(hf, vocab, new_tokens: int, lookup: int | None):
    """transformers' ``generate`` on the prompts as our generation reads them (the start
    ``<eos>``, then their ids; left-padded, with an attention mask): greedy, or prompt lookup
    decoding of ``lookup`` tokens. The end-of-text id is unset, so that every row gets
    ``new_tokens`` tokens, as ours do."""

    def run(prompts: Sequence[Sequence[str]]) -> Outcome:
        ids = [[vocab.eos_id, *vocab.encode(list(p)).tolist()] for p in prompts]
        longest = max(len(i) for i in ids)
        tokens = torch.tensor([[vocab.eos_id] * (longest - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (longest - len(i)) + [1] * len(i) for i in ids])
        options: dict[str, Any] = {
            "do_sample": False,
            "num_beams": 1,
            "max_new_tokens": new_tokens,
            "min_new_tokens": None,
            "eos_token_id": None,
            "pad_token_id": vocab.eos_id,
            "use_cache": True,
        }
        if lookup:
            options["prompt_lookup_num_tokens"] = lookup
        with torch.no_grad():
            out = hf.generate(tokens, attention_mask=mask, **options)
        return Outcome([[vocab.itos[t] for t in row] for row in out[:, longest:].tolist()])

    return run


def hf_lookup_batches(hf, vocab, prompts) -> str | None:
    """None where transformers runs prompt lookup decoding at batch 2, else what it said."""
    try:
        transformers_generate(hf, vocab, 2, 3)(prompts[:2])
    except ValueError as error:  # "assisted generate is only supported for batch_size = 1"
        return str(error).splitlines()[0]
    return None


def with_heads(body, heads_model, label: str):
    """``body`` (shared modules) with the heads of ``heads_model``, whose body must be the
    same weights (heads trained on a frozen body by ``targetlm train-heads``)."""
    mine = {k: v for k, v in body.state_dict().items() if not k.startswith("heads.")}
    theirs = {k: v for k, v in heads_model.state_dict().items() if not k.startswith("heads.")}
    if mine.keys() != theirs.keys() or not all(
        mine[k].shape == theirs[k].shape and torch.equal(mine[k], theirs[k]) for k in mine
    ):
        raise SystemExit(f"--heads {label}: its body is not --run's (other weights)")
    if heads_model.heads is None or heads_model.num_heads < 1:
        raise SystemExit(f"--heads {label}: the run has no drafting heads")
    model = copy.copy(body)
    model._modules = {**body._modules, "heads": heads_model.heads}
    vars(model).pop("heads", None)  # a body built without heads holds a plain None
    return model.eval()


def quick_models(seed: int = 0):
    """A tiny random Llama body (transformers) with random ``mtp`` heads, a vocabulary of its
    size and prompts that repeat themselves in places (so that prompt lookup has matches)."""
    from targetlm.config import ComponentConfig, ModelConfig
    from targetlm.data import Vocabulary
    from targetlm.modules import build_model

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(62)]
    vocab = Vocabulary(words, [1] * len(words))
    llama = {
        "model_type": "llama",
        "vocab_size": len(words),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
    torch.manual_seed(seed)
    config = ModelConfig(
        backbone=ComponentConfig("hf", {"config": llama}), heads=ComponentConfig("mtp", {"n": 4})
    )
    model = build_model(config, words).eval()
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.normal_(0, 0.3)
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for length in LENGTHS[:4]:
        half = torch.randint(2, len(words), (length // 2,), generator=generator).tolist()
        prompts.append([words[i] for i in half + half])
    return vocab, model, prompts


def arms_of(args, body, vocab, heads: dict[str, Any], prompts) -> list[Arm]:
    """Every arm at every thread count and batch size."""
    hf = body.encoder.pretrained[0].eval() if isinstance(body.encoder, HfEncoder) else None
    refused = None if hf is None else hf_lookup_batches(hf, vocab, prompts)
    if refused is not None:
        print(f"note: transformers runs prompt lookup at batch 1 only ({refused})")
    makers: list[tuple[str, Callable, bool]] = [  # name, generation, runs beyond batch 1
        ("greedy", ours(body, vocab, args.new_tokens, None, None), True)
    ]
    if hf is not None and not args.no_hf_peers:
        makers.append(("hf greedy", transformers_generate(hf, vocab, args.new_tokens, None), True))
        for k in args.hf_lookup_tokens:
            run = transformers_generate(hf, vocab, args.new_tokens, k)
            makers.append((f"hf lookup {k}", run, refused is None))
    makers.append(
        ("lookup", ours(body, vocab, args.new_tokens, "lookup", args.lookup_tokens), True)
    )
    for label, model in heads.items():
        makers.append((f"heads {label}", ours(model, vocab, args.new_tokens, "heads", None), True))
        makers.append((f"both {label}", ours(model, vocab, args.new_tokens, "both", None), True))
    return [
        Arm(name, threads, batch, run)
        for threads in args.threads
        for batch in args.batch
        for name, run, batches in makers
        if batch == 1 or batches
    ]


def measured(arm: Arm, prompts, outcomes: dict[str, Outcome], cpu: dict[str, list[float]]):
    """A side of the harness: the arm's generation of every prompt, ``arm.batch`` at a time;
    returns tokens per wall second, keeps tokens per CPU second and the outcome."""

    def run() -> float:
        torch.set_num_threads(arm.threads)
        rows, parts = [], []
        started, cpu_started = time.perf_counter(), time.process_time()
        for first in range(0, len(prompts), arm.batch):
            outcome = arm.run(prompts[first : first + arm.batch])
            rows += outcome.rows
            parts.append(outcome.stats)
        wall, used = time.perf_counter() - started, time.process_time() - cpu_started
        outcomes[arm.key] = Outcome(rows, merged(parts))
        made = sum(len(r) for r in rows)
        cpu.setdefault(arm.key, []).append(made / used)
        return made / wall

    return run


def report(arm: Arm, speeds, cpu, outcomes, greedy: Arm, hf_greedy: Arm | None) -> dict:
    """One row of the table: speeds, speed-ups and, for our drafting arms, the drafting."""
    own, base = speeds[arm.key], speeds[greedy.key]
    rows, reference = outcomes[arm.key].rows, outcomes[greedy.key].rows
    differing = sum(a != b for a, b in zip(rows, reference))
    record: dict[str, Any] = {
        "arm": arm.name,
        "threads": arm.threads,
        "batch": arm.batch,
        "tokens_per_s": median(own),
        "min_max": [min(own), max(own)],
        "cpu_tokens_per_s": median(cpu[arm.key]),
        "speedup": median(own) / median(base),
        "cpu_speedup": median(cpu[arm.key]) / median(cpu[greedy.key]),
        "speedup_vs_hf_greedy": None,
        "differing_rows": differing,
    }
    if hf_greedy is not None:
        record["speedup_vs_hf_greedy"] = median(own) / median(speeds[hf_greedy.key])
    stats = outcomes[arm.key].stats
    if stats is not None and stats.row_steps:
        body_step = arm.batch / median(base)  # our greedy's seconds per forward (a token a row)
        draft = stats.draft_seconds / stats.steps / body_step
        verify = stats.verify_seconds / stats.forwards / body_step
        record |= {
            "accepted_per_step": stats.acceptance,
            "acceptance_by_position": [n / stats.row_steps for n in stats.accepted_at],
            "forwards": stats.forwards,
            "draft_cost": draft,
            "verify_cost": verify,
            "break_even": draft + verify - 1,
        }
    return record


def table(records: list[dict]) -> None:
    print(
        "\n| threads | batch | arm | tokens/s | min-max | vs greedy | CPU vs greedy "
        "| vs hf greedy | accepted/step | by position | draft | verify | break-even | same |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")

    def f(value, digits=2, suffix=""):
        return "" if value is None else f"{value:.{digits}f}{suffix}"

    for r in records:
        low, high = r["min_max"]
        positions = " ".join(f"{p:.2f}" for p in r.get("acceptance_by_position", []))
        same = "yes" if not r["differing_rows"] else f"{r['differing_rows']} rows differ"
        print(
            f"| {r['threads']} | {r['batch']} | {r['arm']} | {r['tokens_per_s']:.1f} | "
            f"{low:.0f}-{high:.0f} | {r['speedup']:.2f}x | {r['cpu_speedup']:.2f}x | "
            f"{f(r['speedup_vs_hf_greedy'], suffix='x')} | {f(r.get('accepted_per_step'))} | "
            f"{positions} | {f(r.get('draft_cost'))} | {f(r.get('verify_cost'))} | "
            f"{f(r.get('break_even'))} | {same} |"
        )


def integers(text: str) -> list[int]:
    values = [int(t) for t in text.split(",") if t.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, help="the body: a run or a config file (its model as built)")
    p.add_argument(
        "--heads",
        type=Path,
        action="append",
        default=[],
        help="a run whose drafting heads draft on --run's body (repeatable)",
    )
    p.add_argument("--threads", type=integers, default=[1, 2], help="thread counts, e.g. 1,2")
    p.add_argument("--batch", type=integers, default=[1, 4], help="batch sizes, e.g. 1,4")
    p.add_argument("--prompts", type=int, default=4, help="prompts from the test split")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--lookup-tokens", type=int, help="our lookup's draft (default: its own, 10)")
    p.add_argument("--hf-lookup-tokens", type=integers, default=[3, 10])
    p.add_argument("--no-hf-peers", action="store_true", help="skip transformers' generate")
    add_arguments(
        p,
        quick="a tiny random Llama with mtp heads: every arm, 16 tokens, one thread",
        rounds=5,
        quick_rounds=2,
    )
    args = p.parse_args(argv)
    resolve_rounds(args, p)
    if args.quick:
        args.new_tokens, args.threads = 16, [1]
    elif args.run is None and not args.heads:
        p.error("--run or --heads is required (or --quick)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    warn_if_loaded()
    if args.quick:
        vocab, body, prompts = quick_models()
        heads = {"mtp (random)": body}
    else:
        config, vocab, body, _ = load_run(args.run or args.heads[0])
        prompts = prompts_from(config, vocab, args.prompts)
        heads = {path.name: with_heads(body, load_run(path)[2], path.name) for path in args.heads}
    arms = arms_of(args, body.eval(), vocab, heads, prompts)
    outcomes: dict[str, Outcome] = {}
    cpu: dict[str, list[float]] = {}
    sides = {arm.key: measured(arm, prompts, outcomes, cpu) for arm in arms}
    started = time.perf_counter()
    speeds = interleaved(sides, args.rounds, warmup=1, order="rotate")
    cpu = {key: values[1:] for key, values in cpu.items()}  # not the warm-up round's
    seconds = time.perf_counter() - started
    by_key = {(a.name, a.threads, a.batch): a for a in arms}
    records = []
    for arm in arms:
        greedy = by_key[("greedy", arm.threads, arm.batch)]
        hf_greedy = by_key.get(("hf greedy", arm.threads, arm.batch))
        records.append(report(arm, speeds, cpu, outcomes, greedy, hf_greedy))
    identical = all(r["differing_rows"] == 0 for r in records if not r["arm"].startswith("hf "))
    table(records)
    print(
        f"\n{len(prompts)} prompts, {args.new_tokens} new tokens, median of {args.rounds} "
        f"rounds after a warm-up ({seconds:.0f} s), load average {load_average():.1f} after; "
        f"our outputs identical to our greedy: {'yes' if identical else 'NO'}"
    )
    result = {
        "identical": identical,
        "arms": records,
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "seconds_of_rounds": seconds,
        "environment": {
            "argv": sys.argv[1:] if argv is None else list(argv),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    emit(result, args.json_out, samples=speeds)
    if not identical:
        raise SystemExit("our speculative outputs differ from our greedy decoding's")


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
