"""What fits where: for published models (configs/hf/), full fine-tuning and
LoRA, on 1 x 24 GB, 1 x 80 GB and 8 x 80 GB: memwall's auto choice and its
predicted device peak, beside the two estimators people use today, computed
in the same run from the same model:

- accelerate's `estimate-memory` "Training using Adam" figure: its own
  functions (accelerate.utils.calculate_maximum_sizes on the meta model,
  accelerate.commands.estimate.estimate_training_usage) when accelerate is
  installed, else its published rule (the largest of model, gradients,
  optimizer and step bytes for bf16 mixed precision: 8 bytes per parameter);
- DeepSpeed's estimate_zero3_model_states_mem_needs_all_live, no-offload
  row: its published formula, 4 bytes x the largest module's parameters
  + 18 bytes x parameters / GPUs (DeepSpeed is not installed here).

Both count model states only. Each is set beside memwall's dry run of
the configuration it describes (accelerate: plain Adam on one GPU, memwall
stage 0 without recomputation; DeepSpeed: ZeRO-3 without offload over the
machine's GPUs, memwall stage 3 likewise): "left out" is the share of
memwall's predicted peak for that configuration (model states,
activations, buffers, allocator rounding, the 1 GiB CUDA runtime
allowance) the figure does not cover; negative where the figure is larger
(LoRA: both count every parameter as trained). These are plans; no GPU
measured them.

Usage (after tools/python_env.sh): .venv/bin/python benchmarks/fits_where.py
    [--models llama-3-8b,...] [--seq 4096] [--lora-rank 16]
"""
import argparse
import os
import time

import torch

import memwall.hf as hf
import memwall.torch as mt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "llama-3-70b", "qwen2-72b"]
MACHINES = [("1x24GB", 1, "24GB"), ("1x80GB", 1, "80GB"), ("8x80GB", 8, "80GB")]
CONFIG = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
GB = 1e9


def accelerate_figure(model):
    """accelerate estimate-memory's "Training using Adam" bytes (bf16)."""
    try:
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
    except ImportError:
        total = sum(p.numel() for p in model.parameters()) * 4
        return 2 * total, "rule"
    total, _ = calculate_maximum_sizes(model.float())
    model.to(torch.bfloat16)
    return max(estimate_training_usage(total, "bfloat16").values()), "accelerate"


def deepspeed_figure(model, gpus):
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return 4 * largest + 18 * total / gpus


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--lora-rank", type=int, default=16)
    args = parser.parse_args()
    print("seq %d, micro-batch 1, bf16, flash attention, host 512 GiB per GPU; LoRA: rank %d on "
          "q_proj, v_proj"
          % (args.seq, args.lora_rank))
    print("%-13s %-5s %-7s %-58s %7s | %8s %8s %6s | %8s %8s %6s" % (
        "model", "tune", "GPUs", "memwall --auto choice", "need GB", "accel.", "memwall",
        "left", "DeepSp.", "memwall", "left"))
    for name in args.models.split(","):
        path = os.path.join(ROOT, "configs", "hf", name + ".json")
        for tune in ("full", "lora"):
            start = time.perf_counter()
            d = hf.describe(path, seq=args.seq, dtype="bf16",
                            lora_rank=args.lora_rank if tune == "lora" else 0)
            traced = time.perf_counter() - start
            model = hf.build(path, "bf16")
            acc, how = accelerate_figure(model)
            plain = mt.plan(d, gpus=1, device_memory="1000GB",
                            config={**CONFIG, "zero_optimization": {"stage": 0}})
            for label, gpus, memory in MACHINES:
                start = time.perf_counter()
                r = mt.plan(d, gpus=gpus, device_memory=memory, config=CONFIG, auto=True)
                planned = time.perf_counter() - start
                ds = deepspeed_figure(model, gpus)
                zero3 = mt.plan(d, gpus=gpus, device_memory="1000GB",
                                config={**CONFIG, "zero_optimization": {"stage": 3}})
                if r["fits"]:
                    choice = r["chosen"].replace("recomputation ", "recomp. ")
                    need = "%7.1f" % (r["plan"]["device"]["needed"] / GB)
                else:
                    least = min(r["candidates"], key=lambda c: c["device_needed"])
                    choice = "no fit (least device %.1f GB, its host %.0f GB)" % (
                        least["device_needed"] / GB, least["host_peak"] / GB)
                    need = "%7s" % "-"
                cells = []
                for figure, ours in ((acc, plain), (ds, zero3)):
                    mem = ours["device"]["needed"]
                    cells.append("%8.1f %8.1f %5.0f%%" % (figure / GB, mem / GB,
                                                          100 * (mem - figure) / mem))
                print("%-13s %-5s %-7s %-58s %s | %s | %s   (trace %.1f s, auto %.1f s)" % (
                    name, tune, label, choice[:58], need, cells[0], cells[1], traced, planned))
    print("accelerate figures from: %s" % how)


if __name__ == "__main__":
    main()
