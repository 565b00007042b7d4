"""One process of a job that initialises torch.distributed (gloo, a file
rendezvous) and then makes a ZeroOptimizer, as a script launched by
mpirun (rank and size from MPI's environment, as the README's
"Launchers" says) or by a launcher that starts no MPI job (RANK and
WORLD given, as torchrun sets them).

Usage: torch_distributed.py OUT RENDEZVOUS_FILE [RANK WORLD]
Writes OUT.rank<torch rank>: {"torch": [rank, world], "memwall": [the
engine's rank, world], "weights": the first layer's weights after 3 steps}
or {"error": the ValueError's message}."""
import json
import os
import sys

import torch
import torch.distributed as dist

import memwall.torch as mt

out, rendezvous = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:
    rank, world = int(sys.argv[3]), int(sys.argv[4])
else:
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
result = {"torch": [dist.get_rank(), dist.get_world_size()]}
try:
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 2},
                                         "optimizer": {"type": "AdamW",
                                                       "params": {"lr": 1e-2}}})
except ValueError as error:
    result["error"] = str(error)
else:
    result["memwall"] = [opt.engine.rank, opt.engine.world_size]
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(3):
        x = torch.randn(4, 8, generator=data)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    result["weights"] = model[0].weight.detach().reshape(-1).tolist()
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
