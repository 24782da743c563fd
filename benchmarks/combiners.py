"""Composed evaluation: the head ensemble (several λ) with a neural cache in one pass of the
evaluation loop, against the two passes it replaces (the ensemble alone, then the cache alone).

Zaremba-small LSTM with WDR heads (N = 3) over a 10k vocabulary, a Zipfian random text; the
one pass runs the encoder and the heads once and the logit layer once per stream (main + each
λ), each stream's probabilities then mixed with the one neural cache. Rounds alternate the
order of the two variants; the median is reported.

    python benchmarks/combiners.py [--tokens 20000] [--rounds 3] [--json-out F] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from common import emit, interleaved, medians, seconds_of, zipf_ids

from targetlm import config as config_lib
from targetlm.config import ComponentConfig
from targetlm.data.vocab import Vocabulary
from targetlm.inference.scoring import Combiners, score_streams
from targetlm.modules import build_model

VOCAB = 10_000
LAMBDAS = (0.2, 0.4, 0.6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/zaremba-small-ptb.toml")
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 tokens, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.rounds = 1000, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_lib.load(args.config, ["data.name=synthetic"])
    heads = ComponentConfig("wdr", {"n": 3})
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(config.model, heads=heads), VOCAB).eval()
    words = [f"w{i}" for i in range(VOCAB - 2)]
    vocab = Vocabulary.build(words)  # every word once: ids follow the list after the specials
    tokens = [vocab.itos[i] for i in zipf_ids(len(vocab), (args.tokens,)).tolist()]
    batching = {"batch_size": config.eval.batch_size, "segment": config.data.bptt}
    cache = {"neural_cache": 0.1, "neural_theta": 0.5, "neural_window": 2000}

    def one_pass() -> list:
        combiners = Combiners(ensemble_lambdas=LAMBDAS, **cache)
        return score_streams(model, vocab, tokens, combiners=combiners, **batching)

    def two_passes() -> list:
        ensemble = score_streams(
            model, vocab, tokens, combiners=Combiners(ensemble_lambdas=LAMBDAS), **batching
        )
        cached = score_streams(model, vocab, tokens, combiners=Combiners(**cache), **batching)
        return [cached[0], *ensemble[1:]]

    variants = {"one_pass": seconds_of(one_pass), "two_passes": seconds_of(two_passes)}
    samples = interleaved(variants, args.rounds)
    median = medians(samples)
    ratio = median["one_pass"] / median["two_passes"]
    print(f"{'variant':<12}{'s/pass':>10}{'tok/s':>10}")
    for name, seconds in median.items():
        print(f"{name:<12}{seconds:>10.2f}{args.tokens / seconds:>10.0f}")
    print(f"one pass / two passes: {ratio:.3f}")
    result = {
        "config": args.config,
        "tokens": args.tokens,
        "lambdas": list(LAMBDAS),
        "neural_cache": cache,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "seconds": median,
        "one_over_two": ratio,
    }
    emit(result, args.json_out, samples=samples)


if __name__ == "__main__":
    main()
