"""Replay captured PolicyEngine.decide calls: min-of-N seconds each, and the plan and the
decision's record compared with the captured run's.   python replay.py FILE.pkl [N] [--dump OUT]"""
import pickle, sys, time, json, cProfile, pstats, os
N = int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else 5
captured = pickle.load(open(sys.argv[1], "rb"))
total = 0.0; same = 0; records = []
prof = cProfile.Profile() if os.environ.get("PROFILE") else None
for blob, seconds, plan, step in captured:
    best = float("inf")
    for _ in range(N):
        engine, a, k = pickle.loads(blob)
        t = time.perf_counter()
        if prof: prof.enable()
        d = engine.decide(*a, **k)
        if prof: prof.disable()
        best = min(best, time.perf_counter() - t)
    total += best
    same += d.plan == plan
    records.append(d.to_dict())
print(f"{sys.argv[1]}: {len(captured)} decisions, sum of min-of-{N} {total*1e3:.1f} ms, plans identical {same}/{len(captured)}")
if "--dump" in sys.argv:
    json.dump(records, open(sys.argv[sys.argv.index("--dump") + 1], "w"), sort_keys=True, default=str)
if prof:
    pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "25")))
