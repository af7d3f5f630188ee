import sys, time, runpy, functools
import autocomp.policy.search as S
import autocomp.policy.engine as E
import autocomp.exposure as X
acc = {}
def timed(mod, name, key):
    f = getattr(mod, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    setattr(mod, name, w)
timed(S, "search", "search")
timed(S, "_fastest_plan", "fastest_plan")
timed(S, "_greedy_accuracy", "greedy")
timed(S, "_solve_caps", "solve_caps")
timed(S, "progress_ascent", "ascent")
timed(S, "_drop_useless", "drop_useless")
try:
    import autocomp.policy.plan_load as L
    timed(L.PlanMoves, "trial", "trial")
    timed(L.SearchProblem, "totals", "totals")
    timed(L.BucketGroups, "timeline", "timeline")
except ImportError:
    timed(S.PlanMoves, "trial", "trial")
    timed(S._Problem, "totals", "totals")
    timed(S.BucketGroups, "timeline", "timeline")
timed(E.PolicyEngine, "decide", "engine.decide")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print({k: round(v, 3) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])})
