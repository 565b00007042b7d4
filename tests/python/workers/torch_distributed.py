"""One process of a job that initialises torch.distributed (gloo) and then
makes a ZeroOptimizer: launched by mpirun (rank and size from MPI's
environment, as the README's "Launchers" says), by torchrun (torch's
environment: memwall joins its ranks into one MPI world), or, with --as,
as rank RANK of WORLD through a file rendezvous (under mpirun, a file per
MPI rank: a torch.distributed world other than MPI's).

Usage: torch_distributed.py OUT RENDEZVOUS_FILE [--stage S] [--as RANK WORLD]
Writes OUT.rank<MPI's rank under mpirun, else torch's>: {"torch": [rank, world], "memwall": [the
engine's rank, world], "nodes": the engine's node count, "weights": every
parameter's values after 3 steps (rank r's batches: torch.randn(4, 8) from
a generator seeded 1 + r)} or {"error": the ValueError's message}."""
import argparse
import json
import os

import torch
import torch.distributed as dist

import memwall.torch as mt

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("rendezvous")
parser.add_argument("--stage", type=int, default=2)
parser.add_argument("--as", dest="as_", nargs=2, type=int)
args = parser.parse_args()
# Under mpirun each process its own result (and, with --as, rendezvous) file.
mpi_rank = os.environ.get("OMPI_COMM_WORLD_RANK")
if args.as_:
    rank, world = args.as_
    rendezvous = args.rendezvous + ("" if mpi_rank is None else "." + mpi_rank)
    dist.init_process_group("gloo", init_method="file://" + os.path.abspath(rendezvous),
                            rank=rank, world_size=world)
elif "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    dist.init_process_group("gloo")
    rank = dist.get_rank()
else:
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + os.path.abspath(args.rendezvous),
                            rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
result = {"torch": [dist.get_rank(), dist.get_world_size()]}
try:
    opt = mt.ZeroOptimizer(model, None, {
        "zero_optimization": {"stage": args.stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}})
except ValueError as error:
    result["error"] = str(error)
else:
    result["memwall"] = [opt.engine.rank, opt.engine.world_size]
    result["nodes"] = opt.communication()["nodes"]
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(3):
        x = torch.randn(4, 8, generator=data)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    with opt.gathered_parameters():
        result["weights"] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
with open("%s.rank%s" % (args.out, rank if mpi_rank is None else mpi_rank), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
