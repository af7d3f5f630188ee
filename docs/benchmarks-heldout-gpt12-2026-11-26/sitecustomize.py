# Held-out task for a scratch check (not in the repo): a 12-layer GPT byte LM.
import autocomp_bench.tasks as T
from autocomp_bench import workloads

_orig = T._build


def _build(name):
    if name == "gpt-deep":
        return T._lm_task(
            name,
            "held-out: GPT byte LM, d 128, 12 layers, context 64, AdamW 1e-3, batch 16",
            lambda: workloads.GPTLanguageModel(context=64, d_model=128, heads=4, layers=12),
            context=64,
            batch=16,
            make_optimizer=T._adamw(1e-3),
            sequence=True,
        )
    return _orig(name)


T._build = _build
T.TASKS = (*T.TASKS, "gpt-deep")
