"""Under torchrun without torch.distributed initialised: rank 0 makes a
ZeroOptimizer with a 3 s timeout while rank 1 sleeps 8 s and never calls
memwall. Writes OUT.rank0: {"error": "<kind>: <text>"} (or {"returned": true})."""
import json
import os
import sys
import time

import torch

import memwall.torch as mt

if os.environ["RANK"] == "0":
    try:
        mt.ZeroOptimizer(torch.nn.Linear(4, 4), None, {"zero_optimization": {"stage": 2}},
                         collective_timeout=3)
        result = {"returned": True}
    except Exception as error:
        result = {"error": "%s: %s" % (type(error).__name__, error)}
    with open(sys.argv[1] + ".rank0", "w") as f:
        json.dump(result, f)
else:
    time.sleep(8)
