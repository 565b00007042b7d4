"""One rank of the three-leg round trip on real ranks, with gradient
accumulation through loss.backward(): a ZeroOptimizer trains 2 steps (2
micro-batches a step, each rank its share, plain loss.backward()), torch's
AdamW (every rank alike, on the whole batch) loads its state_dict and its
full model state dict and trains 2 more, a new ZeroOptimizer loads
torch's state_dict into the model torch trained and trains the last 2;
torch's AdamW alone on the whole batch for the 6 steps is the reference.

Usage: round_trip.py OUT STAGE
Writes OUT.rank<r>: {"weight_error": the largest |master weight -
reference weight|, "torch_step", "master_weight_step": what the torch
leg's state dict says, "steps": the last ZeroOptimizer's steps applied}."""
import copy
import json
import sys

import torch

import memwall.torch as mt

out, stage = sys.argv[1], int(sys.argv[2])
config = {"zero_optimization": {"stage": stage}, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}
torch.manual_seed(0)
start = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.LayerNorm(12),
                            torch.nn.Linear(12, 3))
data = torch.Generator().manual_seed(1)
batches = [(torch.randn(16, 6, generator=data), torch.randn(16, 3, generator=data))
           for _ in range(6)]


def zero_steps(model, opt, steps):
    """Each step: this rank's share of the batch in 2 micro-batches, each
    through plain loss.backward()."""
    rank, ranks = opt.engine.rank, opt.engine.world_size
    share = 16 // ranks
    for x, y in steps:
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        for half in (slice(0, share // 2), slice(share // 2, share)):
            torch.nn.functional.mse_loss(model(x[half]), y[half]).backward()
        opt.step()
        opt.zero_grad()


def torch_steps(model, opt, steps):
    for x, y in steps:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


reference = copy.deepcopy(start)
torch_steps(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05),
            batches)

model = copy.deepcopy(start)
opt = mt.ZeroOptimizer(model, None, config)
zero_steps(model, opt, batches[:2])
state, weights = opt.state_dict(), opt.full_model_state_dict()  # collective
plain = copy.deepcopy(start)
plain.load_state_dict(weights)
plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.05)
plain_opt.load_state_dict(state)
torch_steps(plain, plain_opt, batches[2:4])
back = plain_opt.state_dict()
again = copy.deepcopy(plain)
opt2 = mt.ZeroOptimizer(again, None, config)
opt2.load_state_dict(back)
zero_steps(again, opt2, batches[4:])
masters = {n: opt2.master_weights(n) for n, _ in reference.named_parameters()}  # collective
with open("%s.rank%d" % (out, opt2.engine.rank), "w") as f:
    json.dump({"weight_error": max((masters[n] - p.detach()).abs().max().item()
                                   for n, p in reference.named_parameters()),
               "torch_step": float(back["state"][0]["step"]),
               "master_weight_step": back["state"][0]["master_weight_step"],
               "steps": opt2.engine.progress()["steps_applied"]}, f)
