"""Session-53 harness: session-52/inter_rules.py (interleaved modes over a shaped link) with
  - MODE~N: MODE again (a noise control);
  - BLOCK=n: modes in blocks of n steps (session-51/inter/inter_shaped.py) instead of step by
    step, so that an adaptive mode times its own steps (interleaved, its step reads every
    mode's); SKIP=k: the first k steps of each mode left out of the medians (default 10);
  - free_timed: adaptive, with rank 0's boundary parts timed and printed (DECIDE, PROBE,
    TIMED; CPROF=1 adds a cProfile of the decisions, /tmp/decide.prof) and autocomp's INFO log;
  - free_f16: adaptive on a policy whose candidates are none and fp16 only;
  - task digits-vit-deep: the digits ViT at d 64, 16 blocks (196 tensors).
From the repository root (as root: network namespaces):
  BLOCK=400 PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-53/seq.py \
      free_timed 400 digits-vit-deep 200 OUT.json"""
import importlib.util, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "session-52"))
import inter_rules
inter = inter_rules.inter
inter.__file__ = os.path.abspath(__file__)
_b = inter.build
import autocomp_bench.tasks as _tasks
_orig_build_task = _tasks.build_task
def _build_task(name):
    if name == "digits-vit-deep":
        from autocomp_bench import workloads
        t = _orig_build_task("digits-vit")
        import dataclasses
        return dataclasses.replace(t, build_model=lambda: workloads.DigitsViT(d_model=64, heads=4, layers=16))
    return _orig_build_task(name)
_tasks.build_task = _build_task
def _f16_only_policy():
    import re, tempfile
    text = open(os.path.join(HERE, "..", "..", "..", "policies", "default.toml")).read()
    text = re.sub(r"candidates = \[[^\]]*\]", 'candidates = ["none", "fp16:ef=false"]', text)
    path = os.path.join(tempfile.gettempdir(), "f16only.toml")
    open(path, "w").write(text)
    return path
def build(mode, task):
    mode = mode.split("~")[0]
    if mode == "free_f16":
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        import autocomp
        from autocomp_bench.tasks import build_task
        torch.manual_seed(0)
        spec = build_task(task)
        ddp = DDP(spec.build_model())
        ctl = autocomp.wrap(ddp, target_overlap=0.9, policy=_f16_only_policy())
        return spec, ddp, ctl, spec.make_optimizer(ddp.parameters())
    if mode == "free_timed":
        import time, atexit, collections
        import torch.distributed as dist
        from autocomp import adaptive, planner, opening
        acc = collections.defaultdict(float); cnt = collections.Counter()
        def timed(cls, name):
            f = getattr(cls, name)
            def g(*a, **k):
                t = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    acc[name] += time.perf_counter() - t; cnt[name] += 1
            setattr(cls, name, g)
        timed(adaptive.AdaptiveLoop, "_boundary")
        timed(adaptive.AdaptiveLoop, "_opening")
        import cProfile
        prof = cProfile.Profile()
        f_dec = planner.WindowPlanner.decide
        def dec(self, m, *a, **k):
            t = time.perf_counter()
            prof.enable() if os.environ.get("CPROF") else None
            try:
                return f_dec(self, m, *a, **k)
            finally:
                prof.disable()
                dt = time.perf_counter() - t
                acc["decide"] += dt; cnt["decide"] += 1
                print("DECIDE step", m.step, round(dt * 1000, 1), "ms", flush=True)
        planner.WindowPlanner.decide = dec
        f_pr = opening.ProbeRunner.fastest_all_reduce
        def pr(self, nbytes, *a, **k):
            t = time.perf_counter()
            r = f_pr(self, nbytes, *a, **k)
            print("PROBE", nbytes, round((time.perf_counter() - t) * 1000, 1), "ms", flush=True)
            return r
        opening.ProbeRunner.fastest_all_reduce = pr
        from autocomp.policy import idle_link, payoff
        from autocomp import link_probe
        def watch(cls, name):
            f = getattr(cls, name)
            def g(self, *a, **k):
                r = f(self, *a, **k)
                if r:
                    print("WANT", cls.__name__, name, r, flush=True)
                return r
            setattr(cls, name, g)
        watch(idle_link.IdleLink, "probe_wanted")
        watch(payoff.PayoffCheck, "probe_wanted")
        watch(link_probe.LinkProbe, "next_window")
        import atexit
        atexit.register(lambda: prof.dump_stats("/tmp/decide.prof"))
        timed(adaptive.AdaptiveLoop, "_reread_contention")
        timed(adaptive.AdaptiveLoop, "_measurement")
        def report():
            print("TIMED", {k: (round(v, 3), cnt[k]) for k, v in acc.items()}, flush=True)
        atexit.register(lambda: report() if os.environ.get("GROUP_RANK") == "0" else None)
        mode = "free"
        import logging, torch.distributed as dist2
        if dist2.get_rank() == 0:
            h = logging.StreamHandler(); h.setFormatter(logging.Formatter("LOG %(name)s %(message)s"))
            lg = logging.getLogger("autocomp"); lg.addHandler(h); lg.setLevel(logging.INFO)
    return _b(mode, task)
inter.build = build
if __name__ == "__main__":
    inter.main()
