"""autocomp's benchmarks (``autocomp-bench``), the shaped link and the training workloads.

Installed with the ``bench`` extra; the runtime package ``autocomp`` never imports it.
"""
