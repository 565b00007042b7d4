"""One rank of a ZeroOptimizer run of a small transformers GPT-2 whose model
state dict is saved and loaded the ways users do, next to
torch.optim.AdamW on the whole batch in this same process (the reference).

Usage: model_state_dict.py OUT STAGE DTYPE SAVE_DIR
Every rank trains 2 steps on its share of each batch, then writes
OUT.rank<r>: {"outside": the error model.state_dict() raises outside
gathered_parameters() (empty if none), "equal_master": whether every
parameter in the full state dict is its master weights rounded to the
dtype, "reference_error": the largest |full state dict - reference| over
parameters, "trained": whether every trainable parameter moved from its
initial value, "load_outside": the error of a load outside
gathered_parameters(modify=True), "loaded_error": after loading the
reference's state dict inside it, the largest |master weight - the
reference|, both rounded to the dtype, "reloaded_logits_equal" (rank 0):
whether a model from_pretrained from what rank 0's save_pretrained wrote
inside gathered_parameters() computes the wrapped model's logits bit for
bit}.
"""
import copy
import json
import sys

import torch
import transformers

import memwall.torch as mt
from tiny_gpt2 import tiny_gpt2

out, stage, dtype, save_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
BATCH, SEQ = 8, 16
config, model = tiny_gpt2()
reference = copy.deepcopy(model)
initial = {n: p.detach().clone() for n, p in model.named_parameters()}
opt = mt.ZeroOptimizer(model, None, {
    "zero_optimization": {"stage": stage, "reduce_bucket_size": 2048},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
    "bf16": {"enabled": dtype == "bf16"}})
ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.0)
rank, world = opt.engine.rank, opt.engine.world_size
torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32

data = torch.Generator().manual_seed(1)
share = BATCH // world
for step in range(2):
    tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=data)
    reference(tokens, labels=tokens).loss.backward()
    ref_opt.step()
    ref_opt.zero_grad()
    mine = tokens[rank * share:(rank + 1) * share]
    opt.backward(model(mine, labels=mine).loss)
    opt.step()

result = {"outside": ""}
try:
    model.state_dict()
except RuntimeError as e:
    result["outside"] = str(e)

full = opt.full_model_state_dict()
named = dict(model.named_parameters())
result["equal_master"] = all(
    torch.equal(full[n], opt.master_weights(n).to(torch_dtype)) for n in named)
result["reference_error"] = max(
    (full[n].float() - p.detach()).abs().max().item() for n, p in reference.named_parameters())
result["trained"] = all(not torch.equal(full[n].float(), initial[n].to(torch_dtype).float())
                        for n, p in named.items() if p.requires_grad)

# What rank 0 saves inside the block reloads as the same model.
tokens = torch.randint(0, config.vocab_size, (2, SEQ), generator=data)
with opt.gathered_parameters(), torch.no_grad():
    logits = model(tokens).logits
    if rank == 0:
        model.save_pretrained(save_dir)
if rank == 0:
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(save_dir, torch_dtype=torch_dtype)
    with torch.no_grad():
        result["reloaded_logits_equal"] = torch.equal(reloaded(tokens).logits, logits)

result["load_outside"] = ""
try:
    model.load_state_dict(reference.state_dict())
except RuntimeError as e:
    result["load_outside"] = str(e)
with opt.gathered_parameters(modify=True):
    model.load_state_dict(reference.state_dict())
result["loaded_error"] = max(
    (opt.master_weights(n).to(torch_dtype).float() - p.detach().to(torch_dtype).float())
    .abs().max().item() for n, p in reference.named_parameters())
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
