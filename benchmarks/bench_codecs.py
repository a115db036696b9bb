"""Encode + decode throughput of every codec against memcpy, and its share of a round.

For each model size (the ``small`` and ``gpt2`` presets' parameter counts) and each codec, a
random float32 vector is encoded into a frame and decoded into a vector, both preallocated (as
a worker's buffers are after its first round), several times; the table shows the median
throughput in GB/s of float32 input (encode and decode together), the same for a copy into a
preallocated buffer (memcpy: the limit on this machine), the bytes on the wire per float32
byte, and the share of a round the codec takes when that round is one message over a link of
``--rate-mbit`` (codec time / (codec time + the compressed message's time on the link)).
Usage:

    python benchmarks/bench_codecs.py                     # small and gpt2, 10 Mbit/s
    python benchmarks/bench_codecs.py --sizes small --repeats 9 --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from gasloc_emu import config as C
from gasloc_emu.comm.codecs import CODECS, make_codec, ratio_of
from gasloc_emu.training.model import count_parameters


def median_s(fn, repeats: int) -> float:
    fn()  # warm: allocator, first-touch pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(name: str, x: torch.Tensor, args) -> list[str]:
    numel = x.numel()
    if name == "memcpy":
        out = torch.empty_like(x)
        seconds, ratio = median_s(lambda: out.copy_(x), args.repeats), 1.0
    else:
        codec = make_codec(name, args.ratio, args.block_size)
        frame, out = torch.empty(codec.nbytes(numel), dtype=torch.uint8), torch.empty_like(x)
        seconds = median_s(lambda: codec.decode(codec.encode(x, 7, frame), numel, out),
                           args.repeats)
        ratio = ratio_of(codec, numel)
    wire_s = 4 * numel * ratio * 8 / (args.rate_mbit * 1e6)
    return [name, f"{4 * numel / seconds / 1e9:.2f}", f"{seconds * 1e3:.1f}", f"{ratio:.4f}",
            f"{wire_s:.2f}", f"{100 * seconds / (seconds + wire_s):.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,gpt2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: torch's")
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--rate-mbit", type=float, default=10.0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    head = ["codec", "GB/s", "ms", "wire/raw", "link s", "% of round"]
    for size in args.sizes.split(","):
        numel = count_parameters(C.resolve(overrides={"model.preset": size}).model)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        print(f"\n{size}: {numel:,} values ({4 * numel / 1e6:.1f} MB), {torch.get_num_threads()}"
              f" threads, link {args.rate_mbit:g} Mbit/s")
        rows = [row(name, x, args) for name in ("memcpy", *[c for c in CODECS if c != "none"])]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
