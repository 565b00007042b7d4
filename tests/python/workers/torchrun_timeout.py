"""Under torchrun (no MPI job: memwall joins the ranks): rank 0 alone calls
state_dict(), a collective, with a 3 s timeout while rank 1 sleeps 8 s.
Writes OUT.rank0: {"error": the TimeoutError's text} (or {"returned": true})."""
import json
import sys
import time

import torch
import torch.distributed as dist

import memwall.torch as mt

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 3},
                                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}},
                       collective_timeout=3)
if rank == 0:
    try:
        opt.state_dict()
        result = {"returned": True}
    except TimeoutError as error:
        result = {"error": str(error)}
    with open(sys.argv[1] + ".rank0", "w") as f:
        json.dump(result, f)
else:
    time.sleep(8)
