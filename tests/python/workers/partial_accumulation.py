"""One rank of a loop with two micro-batches a step (gradient_accumulation_steps
2) in which one head of the model gets gradients in only one of them (the
first micro-batch in one step, the second in the next), next to torch's
AdamW on the whole batch in this same process. With hybrid sharding that
head's shard is all-reduced with its replicas once at its last reduction or,
reduced fewer times than the step's micro-batches, at step() (on the host
when offloaded): each path must give torch's result.

Usage: partial_accumulation.py OUT STAGE SHARD ZERO_JSON
SHARD: zero_optimization.mics_shard_size; ZERO_JSON: more zero_optimization
keys (e.g. the offload). Writes OUT.rank<r>: {"weight_error": the largest
|master weight - torch's weight| after 3 steps, "steps": the engine's steps
applied}."""
import copy
import json
import sys

import torch

import memwall.torch as mt

out, stage, shard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = json.loads(sys.argv[4])


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(6, 12)
        self.a = torch.nn.Linear(12, 3)
        self.b = torch.nn.Linear(12, 3)

    def forward(self, x, head):
        return getattr(self, head)(torch.tanh(self.trunk(x)))


torch.manual_seed(0)
model = TwoHeads()
reference = copy.deepcopy(model)
ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05)
opt = mt.ZeroOptimizer(model, None, {
    "gradient_accumulation_steps": 2,
    "zero_optimization": dict({"stage": stage, "mics_shard_size": shard}, **extra),
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}})
rank, world = opt.engine.rank, opt.engine.world_size
data = torch.Generator().manual_seed(1)
share = 8 // world
# Per step, the head each micro-batch trains: b in one of the two.
heads = [("a", "b"), ("b", "a"), ("a", "b")]
for step in range(3):
    batches = [(torch.randn(8, 6, generator=data), torch.randn(8, 3, generator=data))
               for _ in range(2)]
    for (x, y), head in zip(batches, heads[step]):
        # torch: the whole batch, each micro-batch's mean loss halved (the
        # engine averages over the micro-batches itself).
        (torch.nn.functional.mse_loss(reference(x, head), y) / 2).backward()
        mine = slice(rank * share, (rank + 1) * share)
        torch.nn.functional.mse_loss(model(x[mine], head), y[mine]).backward()
    ref_opt.step()
    ref_opt.zero_grad()
    opt.step()
    opt.zero_grad()

result = {"weight_error": max((opt.master_weights(n) - p.detach()).abs().max().item()
                              for n, p in reference.named_parameters()),
          "steps": opt.engine.progress()["steps_applied"]}
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
