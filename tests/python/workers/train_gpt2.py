"""One rank of a ZeroOptimizer run of a small transformers GPT-2, next to
torch.optim.AdamW on the whole batch in this same process (the reference).

Usage: train_gpt2.py OUT STAGE [--dtype f32|bf16] [--steps N] [--save DIR]
                     [--resume DIR]
--save: a memwall checkpoint after the last step (and the reference's
state_dict in OUT.reference.pt). --resume: load one first
and train --steps more from where it stopped (the data and the schedule
skip the steps it had taken; the reference trains from the start, and its
losses and weights are compared over the same steps).
Every rank trains on its share of each micro-batch and writes OUT.rank<r>:
{"losses": its micro-batch losses per step, "reference_losses": the whole
batch's, "weight_error": the largest |master weight - reference| per
parameter, "memory": the engine allocator's bytes by category after the
last step, "groups": the engine's groups}. The model: GPT-2 from a small GPT2Config
(tied wte / lm_head), dropout off, the position embedding frozen; two
param_groups (no weight decay for biases and LayerNorm weights); a LambdaLR
warmup; 2 micro-batches per step; clipping at 1.0.
"""
import argparse
import copy
import json

import torch

import memwall.torch as mt
from tiny_gpt2 import tiny_gpt2

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("stage", type=int)
parser.add_argument("--dtype", default="f32")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--save")
parser.add_argument("--resume")
args = parser.parse_args()

ACCUMULATION, BATCH, SEQ = 2, 8, 16
config, model = tiny_gpt2()
model.transformer.wpe.weight.requires_grad_(False)  # a frozen embedding
reference = copy.deepcopy(model)


def param_groups(m):
    decay = [p for n, p in m.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def warmup(step):
    return min(1.0, (step + 1) / 3)


zero_config = {
    "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 2048},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8}},
    "gradient_accumulation_steps": ACCUMULATION,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": args.dtype == "bf16"},
}
opt = mt.ZeroOptimizer(model, param_groups(model), zero_config)
schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
rank, world = opt.engine.rank, opt.engine.world_size

ref_opt = torch.optim.AdamW(param_groups(reference), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
ref_schedule = torch.optim.lr_scheduler.LambdaLR(ref_opt, warmup)

start = 0
if args.resume:
    start = opt.load_checkpoint(args.resume)["steps"]
    for _ in range(start):
        schedule.step()

data = torch.Generator().manual_seed(1)
losses, reference_losses = [], []
share = BATCH // world
for step in range(start + args.steps):
    step_loss = ref_loss = 0.0
    for micro in range(ACCUMULATION):
        tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=data)
        full = reference(tokens, labels=tokens).loss
        (full / ACCUMULATION).backward()
        ref_loss += full.item() / ACCUMULATION
        if step >= start:
            mine = tokens[rank * share:(rank + 1) * share]
            loss = model(mine, labels=mine).loss
            opt.backward(loss)
            step_loss += loss.item() / ACCUMULATION
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    ref_opt.step()
    ref_opt.zero_grad()
    ref_schedule.step()
    if step >= start:
        opt.step()
        schedule.step()
        losses.append(step_loss)
        reference_losses.append(ref_loss)
if args.save:
    opt.save_checkpoint(args.save)
    if rank == 0:  # the uninterrupted reference's weights, to compare exports with
        torch.save(reference.state_dict(), "%s.reference.pt" % args.out)

errors = {}
for name, p in reference.named_parameters():
    master = opt.master_weights(name)  # collective: every rank
    errors[name] = (master - p.detach()).abs().max().item()
result = {"losses": losses, "reference_losses": reference_losses, "weight_error": errors,
          "memory": opt.memory(), "groups": opt.engine.groups(), "world": world}
with open("%s.rank%d" % (args.out, rank), "w") as f:
    json.dump(result, f)
