import os
if os.environ.get("AC_OPEN_X"):
    import autocomp.opening as O
    O.OPENING_COMPUTE_PER_FORWARD = float(os.environ["AC_OPEN_X"])
