"""How often does a decode of one payload give different bits on CUDA?

Decodes the same unbiased random-k payload (indices drawn with replacement) ``--repeats``
times with the old ``index_add_`` and with ``index_put_(accumulate=True)``, and prints the
number of distinct outputs of each. Run several copies at once to add contention (the
hierarchy test puts 4 ranks on one GPU). Usage: python decode_repeat.py --tag A
"""

from __future__ import annotations

import argparse
import json

import torch


def distinct(numel: int, k: int, repeats: int, accumulate_put: bool, seed: int) -> int:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    indices = torch.randint(0, numel, (k,), generator=gen, device="cuda")
    values = torch.randn(k, generator=gen, device="cuda")
    seen = set()
    for _ in range(repeats):
        out = torch.zeros(numel, device="cuda")
        if accumulate_put:
            out.index_put_((indices,), values, accumulate=True)
        else:
            out.index_add_(0, indices, values)
        seen.add(out.cpu().numpy().tobytes())
    return len(seen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="solo")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    for numel, k in [(96, 48), (4096, 2048), (1 << 16, 1 << 15), (1 << 20, 1 << 18)]:
        reps = args.repeats if numel <= 4096 else max(50, args.repeats // 10)
        for seed in range(3):
            row = {"tag": args.tag, "numel": numel, "k": k, "seed": seed, "repeats": reps}
            row["index_add_"] = distinct(numel, k, reps, False, seed)
            row["index_put_accumulate"] = distinct(numel, k, reps, True, seed)
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
