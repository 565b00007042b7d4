"""One rank of a small transformers GPT-2 trained at stage 3 with each rank
posed as a node of its own (the config's ranks_per_node: 1), exact or with
ZeRO++ (see MODE), and what opt.communication() counted over the last
step.

Usage: communication.py OUT MODE
MODE: exact, qwz (zero_quantized_weights) or zeropp (that, a secondary
partition in blocks of 2 ranks and zero_quantized_gradients).
Writes OUT.rank<r>: {"losses": this rank's per step, "numel": the model's
parameter count (torch's), "step": the last step's counters (each
collective's calls, bytes, intra/inter-node bytes), "nodes", "arrived_last"}."""
import json
import sys

import torch

import memwall.torch as mt
from tiny_gpt2 import tiny_gpt2

out, mode = sys.argv[1], sys.argv[2]
_, model = tiny_gpt2()
numel = sum(p.numel() for p in model.parameters())  # before stage 3 empties the tensors
zero = {"stage": 3}
if mode in ("qwz", "zeropp"):
    zero.update(zero_quantized_weights=True, zero_quantization_block_size=256)
if mode == "zeropp":
    zero.update(zero_hpz_partition_size=2, zero_quantized_gradients=True)
opt = mt.ZeroOptimizer(model, None, {
    "zero_optimization": zero, "ranks_per_node": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})
rank, world = opt.engine.rank, opt.engine.world_size
ids = torch.randint(0, 96, (8, 16), generator=torch.Generator().manual_seed(1 + rank))
losses = []
for step in range(4):
    before = opt.communication()
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
after = opt.communication()
step = {name: {k: after["collectives"][name][k] - c[k] for k in c}
        for name, c in before["collectives"].items()}
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump({"losses": losses, "numel": numel, "step": step, "nodes": after["nodes"], "arrived_last": after["arrived_last"],
               "sums": [after["intra_node_bytes"] - before["intra_node_bytes"],
                        after["inter_node_bytes"] - before["inter_node_bytes"]]}, f)
