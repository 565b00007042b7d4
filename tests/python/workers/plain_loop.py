"""One rank of a torch training loop written as for torch.optim.AdamW
(zero_grad, loss.backward(), step), with the calls such loops make between
steps, next to torch's AdamW on the whole batch in this same process.

Usage: plain_loop.py OUT STAGE [SHARD]
SHARD: zero_optimization.mics_shard_size (hybrid sharding; default -1, none).
Steps: a plain one; zero_grad and a step() with no backward since (changes
nothing); backward, zero_grad, backward, step (only the second counts); an
in-place write of a weight between steps (inside gathered_parameters(
modify=True) at stage 3), then a step. Writes OUT.rank<r>: {"weight_error":
the largest |master weight - torch's weight|, "steps": the engine's steps
applied, "state_keys"/"state_steps"/"state_error": opt.state against torch's
AdamW's state (keys, steps, the largest |moment difference|)}."""
import copy
import json
import sys

import torch

import memwall.torch as mt

out, stage = sys.argv[1], int(sys.argv[2])
shard = int(sys.argv[3]) if len(sys.argv) > 3 else -1
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
reference = copy.deepcopy(model)
ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05)
opt = mt.ZeroOptimizer(model, None, {
    "zero_optimization": {"stage": stage, "mics_shard_size": shard},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}})
rank, world = opt.engine.rank, opt.engine.world_size
data = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 6, generator=data), torch.randn(8, 3, generator=data))
           for _ in range(5)]
share = 8 // world


def backward(m, batch, whole):
    x, y = batch
    if not whole:
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    torch.nn.functional.mse_loss(m(x), y).backward()


for m, o, whole in ((reference, ref_opt, True), (model, opt, False)):
    o.zero_grad()
    backward(m, batches[0], whole)
    o.step()
    o.zero_grad()
    o.step()  # no gradients: nothing changes
    backward(m, batches[1], whole)
    o.zero_grad()  # drops it
    backward(m, batches[2], whole)
    o.step()
    o.zero_grad()
    if m is model and stage == 3:
        with opt.gathered_parameters(modify=True):
            with torch.no_grad():
                m[0].weight.mul_(0.5)
    else:
        with torch.no_grad():
            m[0].weight.mul_(0.5)
    backward(m, batches[3], whole)
    o.step()

# opt.state (collective: every rank reads it) against torch's.
pairs = list(zip(model.parameters(), reference.parameters()))
result = {"weight_error": max((opt.master_weights(n) - p.detach()).abs().max().item()
                              for n, p in reference.named_parameters()),
          "steps": opt.engine.progress()["steps_applied"],
          "state_keys": [sorted(opt.state[p]) == sorted(ref_opt.state[q]) for p, q in pairs],
          "state_steps": [float(opt.state[p]["step"]) for p, _ in pairs],
          "torch_steps": [float(ref_opt.state[q]["step"]) for _, q in pairs],
          "state_error": max((opt.state[p][k] - ref_opt.state[q][k]).abs().max().item()
                             for p, q in pairs for k in ("exp_avg", "exp_avg_sq"))}
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
