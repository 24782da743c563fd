"""Where GroC's step time goes, and which char-CNN window layout is fastest on this device.

The char-CNN encodes every string the vocabulary needs (PTB: 22.5k strings of up to 20
characters) forward and backward at every step. Layouts compared, all giving the same
encodings (``tests/modules/test_outputs.py`` checks the two that targetlm uses):

* ``grouped``: one GEMM per distinct length (no padding FLOPs; ~20 groups of kernels);
  targetlm's choice on CPUs.
* ``single``: every string padded to the longest, one GEMM, invalid windows masked;
  targetlm's choice on GPUs.
* ``buckets``: ``single`` within 3 length buckets (fewer padding FLOPs, 3x the kernels).
* ``conv1d``: ``single`` through ``F.conv1d`` (cuDNN) instead of unfold + GEMM.

Each is timed forward + backward of ``encodings.square().sum()`` in alternating rounds, as a
ratio to ``single`` in the same run. ``--profile`` also prints the top kernels of one GroC
training step (``benchmarks/outputs.py``'s ``groc_p1`` variant).

    python benchmarks/char_cnn.py [--device cuda] [--rounds R] [--steps K] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from common import emit, interleaved, medians, timed
from outputs import Variant, vocabulary, zipf_batches

from targetlm.modules.char_cnn import CharCnn, index_strings


def conv1d(cnn: CharCnn, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    K = cnn.max_width
    weight, bias = cnn._filters()
    weight = weight.view(len(bias), -1, K)  # (S, C, K)
    x = F.pad(cnn.characters(chars).transpose(1, 2), (0, K - 1))  # (N, C, L + K - 1)
    y = F.conv1d(x, weight)  # (N, S, L)
    start = torch.arange(chars.size(1), device=chars.device)
    last = lengths.clamp(min=K)[:, None, None] - cnn.widths[None, :, None]  # (N, S, 1)
    y = y.masked_fill(start > last, float("-inf"))
    return cnn.highway(torch.tanh(y.amax(-1) + bias))


def buckets(
    cnn: CharCnn, chars: torch.Tensor, lengths: torch.Tensor, splits: list[int]
) -> torch.Tensor:
    """``single`` per bucket of rows (rows sorted by length); ``splits``: bucket sizes."""
    pooled, start = [], 0
    for size in splits:
        rows = slice(start, start + size)
        longest = max(int(lengths[start + size - 1]), cnn.max_width)
        pooled.append(cnn._single_pass(chars[rows, :longest], lengths[rows]))
        start += size
    return cnn.highway(torch.tanh(torch.cat(pooled)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    parser.add_argument("--json-out", type=Path, help="also write the JSON record to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    device = torch.device(args.device)
    words, lexicon, source = vocabulary(None)
    index = index_strings(words, lexicon.truncated(3, 10), True, True, 20, 6)
    chars, lengths = index.chars.to(device), index.lengths.to(device)  # sorted by length
    torch.manual_seed(0)
    cnn = CharCnn().to(device)
    cut = [int((lengths <= b).sum()) for b in (8, 12)]
    splits = [cut[0], cut[1] - cut[0], len(lengths) - cut[1]]

    def layout(name: str):
        def run() -> torch.Tensor:
            if name in ("grouped", "single"):
                cnn.single_pass = name == "single"
                return cnn(chars, lengths)
            if name == "conv1d":
                return conv1d(cnn, chars, lengths)
            return buckets(cnn, chars, lengths, splits)

        return run

    names = ["single", "grouped", "buckets", "conv1d"]
    reference = layout("grouped")().detach()
    for name in names:  # loose: cuDNN convolutions may use TF32
        torch.testing.assert_close(layout(name)().detach(), reference, rtol=1e-2, atol=2e-3)

    def side(name: str):
        run = layout(name)

        def step() -> None:
            cnn.zero_grad(set_to_none=True)
            run().square().sum().backward()

        return lambda: timed(step, args.steps, device)

    samples = interleaved({n: side(n) for n in names}, args.rounds)
    ms = {n: s * 1e3 for n, s in medians(samples).items()}
    print(f"{len(words):,} words ({source}), {len(lengths):,} strings, buckets {splits}")
    for name in names:
        print(f"{name:<10}{ms[name]:>9.2f} ms  x single {ms[name] / ms['single']:.2f}")
    result = {"ms_fwd_bwd": ms, "strings": len(lengths), "device": str(device)}
    emit(result, args.json_out, samples=samples)
    if args.profile:
        variant = Variant("groc_p1", words, lexicon, zipf_batches(len(words), 4), device)
        for _ in range(3):
            variant.step()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(5):
                variant.step()
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(profiler.key_averages().table(sort_by=key, row_limit=25))


if __name__ == "__main__":
    main()
