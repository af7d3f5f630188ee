import sys, statistics
sys.path.insert(0, "docs/benchmarks-decide-2026-11-26")
import decide_bench
times, _ = decide_bench.run(400, 50)
print("800 params median", round(statistics.median(times)*1e3), "ms total", round(sum(times), 2))
