# A/B aid: open at 2x instead of 5x, so the n-gram model's loopback opening fires in every run.
from autocomp.planner import WindowPlanner

WindowPlanner.Config.__init__.__kwdefaults__["opening_ratio"] = 2.0
