"""Each rank sets param_groups[1]'s lr to its own value (a schedule that
depends on the rank, say) and steps; writes OUT.rank<r>: the error and
whether any weight moved, then the losses of two steps taken after the
values agree again.
  rank_hyperparameters.py OUT STAGE"""
import json
import sys

import torch

import memwall
import memwall.torch as mt

out, stage = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)  # every rank starts with the same model
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
groups = [{"params": model[0].parameters()}, {"params": model[2].parameters()}]
opt = mt.ZeroOptimizer(model, groups, {"zero_optimization": {"stage": stage}})
rank = opt.engine.rank
opt.param_groups[1]["lr"] = 1e-3 * (rank + 1)
x = torch.ones(2, 4)
opt.backward(model(x).sum())
before = [opt.master_weights(name) for name, _ in model.named_parameters()]
error = None
try:
    opt.step()
except memwall.Error as e:
    error = str(e)
after = [opt.master_weights(name) for name, _ in model.named_parameters()]
opt.param_groups[1]["lr"] = 1e-3
losses = []
for _ in range(2):
    loss = model(x).sum()
    opt.backward(loss)
    opt.step()
    losses.append(loss.item())
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump({"error": error, "unchanged": all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                                                for a, b in zip(before, after)),
               "losses": losses}, f)
