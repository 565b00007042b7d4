"""One rank of the loop an accelerate user writes (memwall.accelerator:
prepare, accumulate, backward, step, zero_grad) with a ZeroOptimizer, next
to plain torch with torch.optim.AdamW on the whole batch in this same
process (each micro-batch's loss divided by the accumulation, as
accelerate's own backward does).

Usage: accelerate_loop.py OUT STAGE
A small GPT-2, 32 sequences in a DataLoader of 2 per rank (global
micro-batch 4 on 2 ranks), 2 micro-batches a step: 4 steps. Writes
OUT.rank<r>: {"losses": this rank's micro-batch losses, "reference_losses":
the reference's per global micro-batch, "steps": the engine's steps,
"weight_error": the largest |master weight - reference weight|}."""
import copy
import json
import sys

import torch

import memwall.accelerator
import memwall.torch as mt
from tiny_gpt2 import tiny_gpt2

out, stage = sys.argv[1], int(sys.argv[2])
_, model = tiny_gpt2()
reference = copy.deepcopy(model)
ids = torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(1))
accelerator = memwall.accelerator.Accelerator(gradient_accumulation_steps=2)
opt = mt.ZeroOptimizer(model, None, {
    "zero_optimization": {"stage": stage}, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}})
ranks = opt.engine.world_size
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4 // ranks)
model, opt, data = accelerator.prepare(model, opt, data)
losses = []
for (batch,) in data:
    with accelerator.accumulate(model):
        loss = model(batch, labels=batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    losses.append(loss.item())

ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.01)
reference_losses = []
for start in range(0, 32, 8):
    for micro in (ids[start:start + 4], ids[start + 4:start + 8]):
        loss = reference(micro, labels=micro).loss
        (loss / 2).backward()
        reference_losses.append(loss.item())
    ref_opt.step()
    ref_opt.zero_grad()
zero = opt.optimizer  # accelerate's wrapper holds the ZeroOptimizer
masters = {n: zero.master_weights(n) for n, _ in reference.named_parameters()}  # collective
with open("%s.rank%d" % (out, zero.engine.rank), "w") as f:
    json.dump({"losses": losses, "reference_losses": reference_losses,
               "steps": zero.engine.progress()["steps_applied"],
               "weight_error": max((masters[n] - p.detach()).abs().max().item()
                                   for n, p in reference.named_parameters())}, f)
