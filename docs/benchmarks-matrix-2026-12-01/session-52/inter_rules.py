"""session-51/inter/inter_shaped.py with one more mode, static_f16_rules: fp16 (ef=false) on
every tensor the engine's rules let it compress, 'none' on the rest (1-D tensors and those
under min_numel elements), as the adaptive fp16 plans are. From the repository root:
  PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-52/inter_rules.py \
      ddp,fp16_hook,static_f16,static_f16_rules 400 digits-vit 500 OUT.json"""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "inter_shaped", os.path.join(HERE, "..", "session-51", "inter", "inter_shaped.py")
)
inter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inter)
inter.__file__ = os.path.abspath(__file__)  # its workers run this file, with this mode
_build = inter.build


def build(mode, task):
    if mode != "static_f16_rules":
        return _build(mode, task)
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autocomp
    from autocomp.policy.rules import load_policy
    from autocomp_bench.tasks import build_task

    rules = load_policy("default")
    torch.manual_seed(0)
    task_spec = build_task(task)
    model = task_spec.build_model()
    plan = {
        name: "none" if p.dim() <= 1 or p.numel() < rules.min_numel else "fp16:ef=false"
        for name, p in model.named_parameters()
    }
    ddp = DDP(model)
    ctl = autocomp.wrap(ddp, plan=plan)
    return task_spec, ddp, ctl, task_spec.make_optimizer(ddp.parameters())


inter.build = build
if __name__ == "__main__":
    inter.main()
