"""Rank 1 raises before its first backward while rank 0 goes on into the
step's collectives: the uncaught exception must end the whole job."""
import torch

import memwall.torch as mt

torch.manual_seed(0)  # every rank starts with the same model
model = torch.nn.Linear(4, 4)
opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 2}})
if opt.engine.rank == 1:
    raise ValueError("deliberate failure on rank 1")
opt.backward(model(torch.ones(2, 4)).sum())
opt.step()
