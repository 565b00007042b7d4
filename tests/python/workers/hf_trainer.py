"""One rank of Hugging Face transformers' Trainer (its own training loop)
with a ZeroOptimizer, through memwall.trainer, next to a plain
transformers.Trainer with torch.optim.AdamW on the whole batch in this
same process (the reference).

Usage: hf_trainer.py OUT STAGE SAVE_DIR [SAMPLES]
SAMPLES: train on the first SAMPLES samples only and write OUT.rank<r>:
{"error": the ValueError train() raised, or ""}.
A small GPT-2, 4 steps of 2 micro-batches (global micro-batch 4, split
across the ranks), sequential data, a constant schedule. Writes
OUT.rank<r>: {"losses": the Trainer's logged loss per step on this rank,
"reference_losses": the reference Trainer's, "weight_error": the largest
|master weight - reference weight|, "saved_error" (rank 0): the largest
|weight from_pretrained of what trainer.save_model wrote - master weight|}.
"""
import copy
import json
import sys

import torch
import transformers

import memwall.torch as mt
import memwall.trainer
from tiny_gpt2 import tiny_gpt2

out, stage, save_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
partial = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # train on this many samples only
config, model = tiny_gpt2()
reference = copy.deepcopy(model)
data = [{"input_ids": t, "labels": t}
        for t in torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(1))]


def arguments(batch):
    return memwall.trainer.TrainingArguments(
               output_dir=save_dir + ".run", per_device_train_batch_size=batch,
               gradient_accumulation_steps=2, max_steps=4, learning_rate=3e-3, weight_decay=0.0,
               max_grad_norm=0.0, lr_scheduler_type="constant", train_sampling_strategy="sequential",
               logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
               use_cpu=True, seed=0)


opt = mt.ZeroOptimizer(model, None, {
    "zero_optimization": {"stage": stage, "reduce_bucket_size": 2048},
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})
rank, world = opt.engine.rank, opt.engine.world_size
trainer = memwall.trainer.Trainer(
    model=model, args=arguments(4 // world),
    train_dataset=data[:partial] if partial else data,
    optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)))
if partial:
    try:
        trainer.train()
        result = {"error": ""}
    except ValueError as e:
        result = {"error": str(e)}
    with open("%s.rank%d" % (out, rank), "w") as f:
        json.dump(result, f)
    sys.exit(0)
trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
trainer.save_model(save_dir)

ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.0)
plain = transformers.Trainer(
    model=reference, args=arguments(4), train_dataset=data,
    optimizers=(ref_opt, torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 1.0)))
plain.train()
masters = {n: opt.master_weights(n) for n, _ in reference.named_parameters()}  # collective
result = {"losses": losses,
          "reference_losses": [h["loss"] for h in plain.state.log_history if "loss" in h],
          "weight_error": max((masters[n] - p.detach()).abs().max().item()
                              for n, p in reference.named_parameters())}
if rank == 0:
    saved = transformers.GPT2LMHeadModel.from_pretrained(save_dir)
    result["saved_error"] = max((masters[n] - p.detach()).abs().max().item()
                                for n, p in saved.named_parameters())
with open("%s.rank%d" % (out, rank), "w") as f:
    json.dump(result, f)
