import logging, time, sys, torch
sys.path.insert(0,'.')
from autocomp.cost_model import CostModel
from autocomp.opening import calibrate, calibration_shape_for
from autocomp.policy.rules import PolicyRules
from autocomp_bench.tasks import build_task
logging.basicConfig(level=logging.WARNING); logging.getLogger("autocomp").setLevel(logging.DEBUG)
torch.set_num_threads(1)
cands = ["none","fp16:ef=false","int8:chunk=256,ef=true","powersgd:rank=16,ef=true","powersgd:rank=4,ef=true","topk:ratio=0.01,ef=true"]
for name in sys.argv[1].split(","):
    m = build_task(name).build_model()
    shape = calibration_shape_for([p.shape for p in m.parameters()])
    cm = CostModel()
    s = time.perf_counter()
    done = calibrate(cm, cands, 2, torch.device("cpu"), large_shape=shape)
    print(name, shape, done, f"{(time.perf_counter()-s)*1e3:.0f} ms", flush=True)
