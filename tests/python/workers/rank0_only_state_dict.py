"""Two ranks; rank 0 alone makes a collective call, as
`if rank == 0: torch.save(opt.state_dict(), ...)` would, with a collective
timeout of 2 s: it raises memwall.DeadlineExceededError (a TimeoutError)
naming the collective instead of waiting 600 s.

Usage: rank0_only_state_dict.py OUT [CALL]
CALL: state_dict (the default), load_state_dict (of a state_dict every
rank took first), gathered_parameters (at stage 3), opt.state (after a
step), save_checkpoint.
Writes OUT.rank<r>: {"error": rank 0's error type and message (rank 1:
"")}, then rank 0 ends the job (the collective it posted cannot be
cancelled, so the ranks cannot finalise MPI normally)."""
import json
import sys
import time

import torch

import memwall
import memwall.torch as mt

out = sys.argv[1]
call = sys.argv[2] if len(sys.argv) > 2 else "state_dict"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 3}}, collective_timeout=2)
rank = opt.engine.rank
if call in ("load_state_dict", "opt.state"):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    saved = opt.state_dict()  # every rank
calls = {"state_dict": lambda: opt.state_dict(),
         "load_state_dict": lambda: opt.load_state_dict(saved),
         "gathered_parameters": lambda: opt.gathered_parameters().__enter__(),
         "opt.state": lambda: len(opt.state),
         "save_checkpoint": lambda: opt.save_checkpoint(out + ".checkpoints")}
result = {"error": ""}
if rank == 0:
    try:
        calls[call]()
    except TimeoutError as e:
        result["error"] = "%s: %s" % (type(e).__name__, e)
        result["is_memwall_error"] = isinstance(e, memwall.Error)
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
if rank == 0:
    memwall.abort_ranks(0)
time.sleep(120)  # rank 0's abort ends this rank
