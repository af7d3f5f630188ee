"""Tier 4: CUDA checks (``make gpu-check``); every test is marked ``gpu`` and skips without a GPU.

The rest of the suite runs on CPU with gloo. These modules check what only a GPU can show:
the compressors on CUDA tensors, the comm hook with CUDA gradients, and the CUDA-event clock
the profiler uses there. :mod:`tests.gpu.cuda` holds the shared skip marks and helpers.
"""
