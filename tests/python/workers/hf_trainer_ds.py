"""One rank of Hugging Face transformers' Trainer given a DeepSpeed config
with "auto" values (memwall.trainer.Trainer(config=...)), as a Trainer
user's ds_config.json is written, next to a plain transformers.Trainer
with its own AdamW on the whole batch in this same process (the
reference): the same arguments (weight decay 0.01 except on biases and
norms, max_grad_norm 1.0, a linear schedule with 2 warm-up steps).

Usage: hf_trainer_ds.py OUT STAGE SCHEDULER
STAGE 2: the zero2 layout of transformers' documentation; 3: the zero3
one, optimizer and parameters offloaded to the CPU. SCHEDULER "engine":
the config's WarmupDecayLR (linear warm-up, its values "auto") schedules the
rate; "trainer": the config has no scheduler and the Trainer's own does.
Writes OUT.rank<r>: {"losses", "reference_losses", "lrs",
"reference_lrs": the logged loss and learning rate per step,
"weight_error": the largest |master weight - reference weight|,
"warnings": memwall's warnings}."""
import copy
import json
import sys
import warnings

import torch
import transformers

import memwall.trainer
from tiny_gpt2 import tiny_gpt2

out, stage, scheduler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
_, model = tiny_gpt2()
reference = copy.deepcopy(model)
data = [{"input_ids": t, "labels": t}
        for t in torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(1))]
zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
        "reduce_bucket_size": "auto"}
if stage == 2:
    zero.update({"allgather_partitions": True, "allgather_bucket_size": 2e8,
                 "reduce_scatter": True})
else:
    zero.update({"offload_optimizer": {"device": "cpu", "pin_memory": True},
                 "offload_param": {"device": "cpu", "pin_memory": True},
                 "sub_group_size": 1e9, "stage3_prefetch_bucket_size": "auto",
                 "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                 "stage3_max_reuse_distance": 1e9,
                 "stage3_gather_16bit_weights_on_model_save": True})
config = {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                    "weight_decay": "auto"}},
          "zero_optimization": zero, "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "steps_per_print": 2000, "train_batch_size": "auto",
          "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
if scheduler == "engine":
    config["scheduler"] = {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
        "total_num_steps": "auto", "warmup_type": "linear"}}
ranks = memwall.world_size()


def arguments(batch):
    return memwall.trainer.TrainingArguments(
               output_dir=out + ".run", per_device_train_batch_size=batch,
               gradient_accumulation_steps=2, max_steps=4, learning_rate=3e-3, weight_decay=0.01,
               lr_scheduler_type="linear", warmup_steps=2, train_sampling_strategy="sequential",
               logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
               use_cpu=True, seed=0)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trainer = memwall.trainer.Trainer(model=model, args=arguments(4 // ranks),
                                      train_dataset=data, config=config)
    trainer.train()
history = trainer.state.log_history
opt = trainer.zero_optimizer
plain = transformers.Trainer(model=reference, args=arguments(4), train_dataset=data)
plain.train()
masters = {n: opt.master_weights(n) for n, _ in reference.named_parameters()}  # collective
result = {"losses": [h["loss"] for h in history if "loss" in h],
          "lrs": [h["learning_rate"] for h in history if "learning_rate" in h],
          "reference_losses": [h["loss"] for h in plain.state.log_history if "loss" in h],
          "reference_lrs": [h["learning_rate"] for h in plain.state.log_history
                            if "learning_rate" in h],
          "weight_error": max((masters[n] - p.detach()).abs().max().item()
                              for n, p in reference.named_parameters()),
          "warnings": [str(w.message) for w in caught if "memwall" in str(w.message)]}
with open("%s.rank%d" % (out, opt.engine.rank), "w") as f:
    json.dump(result, f)
