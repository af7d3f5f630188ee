"""Time the parts of AdaptiveLoop's window boundary in every worker; each rank writes its
totals to boundary-<pid>.json beside this file at exit. Put this folder on PYTHONPATH
(the tta workers inherit it)."""
import atexit, json, os, time, functools
totals = {}
def timed(owner, name, key=None):
    key = key or name
    orig = getattr(owner, name)
    @functools.wraps(orig)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            v = totals.setdefault(key, [0.0, 0])
            v[0] += time.perf_counter() - t; v[1] += 1
    setattr(owner, name, wrapper)
try:
    import autocomp.adaptive as A
    import autocomp.planner as P
    import autocomp.link_probe  # noqa
    L = A.AdaptiveLoop
    for n in ("_boundary", "_broadcast", "_measurement", "_agree_warmup_end", "_apply",
              "_reread_contention", "_sketched", "_remember", "_peer_record", "_node_group"):
        if hasattr(L, n):
            timed(L, n)
    timed(P.WindowPlanner, "decide", "planner.decide")
    import autocomp.opening as O
    timed(O.ProbeRunner, "fastest_all_reduce", "probe.fastest_all_reduce")
    import autocomp.profiler as PR
    for cls in vars(PR).values():
        if isinstance(cls, type) and hasattr(cls, "end_window"):
            timed(cls, "end_window", f"{cls.__name__}.end_window")
    if hasattr(A, "combine_link_busy"):
        timed(A, "combine_link_busy")
    import torch.distributed as dist
    class _D:  # only the adaptive module's reference to dist is wrapped
        def __getattr__(self, n): return getattr(dist, n)
    D = _D(); D.all_reduce = dist.all_reduce; A.dist = D
    timed(D, "all_reduce", "adaptive.dist.all_reduce")
except Exception as err:  # not a worker that imports autocomp
    totals["import_error"] = [0.0, str(err)]
@atexit.register
def _dump():
    if len(totals) > 1:
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"boundary-{os.getpid()}.json")
        json.dump(totals, open(out, "w"), indent=1)
