"""What one more small collective costs at a step's tail on a shaped link (scratch).

Two gloo ranks on a 50 Mbit/s ShapedLink time, over many rounds in turn, a tail like the
held-out GPT's last bucket under rank 4 everywhere (one float32 all-reduce of the round, then
the final round's float32 all-reduce), and the same tail with the extra collectives a mixed
plan adds there: an fp16 all-reduce (the position table on fp16), an int8 all-gather (the tied
embedding on int8), or both. Each is launched as the hook does: after the first round is
done, beside the final round. ``--work-ms W`` adds W ms of matrix products between the first
round and the final round's launch, where the hook computes the final round, so the extra
collectives run beside compute as they do in a training step. Median milliseconds per tail,
and the bytes alone at the link's rate for comparison. Run from the repository root, as root:
    .venv/bin/python docs/benchmarks-static-2026-11-29/tail_collectives.py --rounds 200 [--work-ms 8]
"""

import argparse
import json
import statistics
import sys
import time

# Sizes (elements) from the held-out GPT's last bucket: rank 4's first and final rounds
# with the plain parts, the position table (64x128) on fp16, the embedding (256x128) on int8.
ROUND_1 = 24_000
ROUND_2 = 12_000
FP16 = 64 * 128
INT8_BYTES = 256 * 128 + 4 * 128


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    variants = {
        "rank4 only": (False, False),
        "+ fp16 all-reduce": (True, False),
        "+ int8 all-gather": (False, True),
        "+ both": (True, True),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    work_times: list[float] = []
    r1, r2 = torch.ones(ROUND_1), torch.ones(ROUND_2)
    half = torch.ones(FP16, dtype=torch.float16)
    raw = torch.ones(INT8_BYTES, dtype=torch.uint8)
    world = dist.get_world_size()
    a, b = torch.randn(128, 512), torch.randn(512, 4)
    products = 0
    if args.work_ms > 0:  # products per work_ms, calibrated on this rank, agreed (the max)
        t = time.perf_counter()
        for _ in range(2000):
            torch.mm(a, b)
        per = (time.perf_counter() - t) / 2000
        agreed = torch.tensor([int(args.work_ms / 1e3 / per)])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        products = int(agreed)
    for i in range(args.rounds):
        names = list(variants) if i % 2 == 0 else list(variants)[::-1]
        for name in names:
            with_half, with_gather = variants[name]
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(r1, async_op=True).wait()
            works = []
            if with_half:
                works.append(dist.all_reduce(half, async_op=True))
            if with_gather:
                out = torch.empty(world * INT8_BYTES, dtype=torch.uint8)
                works.append(dist.all_gather_into_tensor(out, raw, async_op=True))
            tw = time.perf_counter()
            for _ in range(products):
                torch.mm(a, b)
            work_times.append(time.perf_counter() - tw)
            works.append(dist.all_reduce(r2, async_op=True))
            for w in works:
                w.wait()
            times[name].append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        times["_work"] = work_times
        json.dump(times, open(args.out, "w"))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--work-ms", type=float, default=0.0)
    p.add_argument("--out", default="/tmp/tail_collectives.json")
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from paired_steps import run_ranks_on_shaped_link

    run_ranks_on_shaped_link(__file__, args.rate, port=29612, timeout_s=900)
    times = json.load(open(args.out))
    work = times.pop("_work")
    print(f"work between the rounds: median {statistics.median(work) * 1e3:.2f} ms (rank 0)")
    rate = args.rate * 1e6 / 8
    extra = {"rank4 only": 0, "+ fp16 all-reduce": FP16 * 2, "+ int8 all-gather": INT8_BYTES,
             "+ both": FP16 * 2 + INT8_BYTES}
    base = statistics.median(times["rank4 only"])
    result = {}
    for name, v in times.items():
        med = statistics.median(v)
        result[name] = {"median_ms": med * 1e3, "added_ms": (med - base) * 1e3,
                        "added_bytes_ms": extra[name] / rate * 1e3}
        print(f"{name:18s} {med * 1e3:7.2f} ms  added {(med - base) * 1e3:+6.2f} ms"
              f"  (its bytes alone at the link rate: {extra[name] / rate * 1e3:.2f} ms)")
    json.dump({"times_ms": {k: [x * 1e3 for x in v] for k, v in times.items()}, "summary": result},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
