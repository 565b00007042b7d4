"""The recomputation plan executed on a torch model (memwall.recompute),
against the same model with no recomputation and with transformers' own
gradient checkpointing (torch.utils.checkpoint around every block,
model.gradient_checkpointing_enable), measured in the same run.

Model: a transformers GPT-2 (12 blocks, width 256, 4 heads, vocabulary
8192, dropout on, SDPA attention), micro-batch 4, sequence 256, f32, CPU.
Per configuration: the bytes autograd holds for backward once forward ends
and at most during the step (saved-tensor hooks, each storage once;
parameters, buffers and the batch left out; transformers' checkpointing
keeps its recomputed tensors out of those hooks, so its peak is not
measured), the step's median time
(forward and backward; --steps steps after one warm-up), and for memwall's
plans the planner's prediction of the first figure and how far the
measurement is from it in bytes (memwall.torch.plan of
memwall.trace.describe, the dry run `memwall plan` makes). Every
configuration's loss and gradients are checked bit for bit against the run
without recomputation.

Usage (after tools/python_env.sh):
  .venv/bin/python benchmarks/torch_recompute.py [--steps N]
"""
import argparse
import copy
import statistics
import time

import torch
import transformers

import memwall.torch as mt
from memwall import trace as tracing
from memwall.recompute import Recomputation, segments_of
from memwall.trace import SavedMeter

BATCH, SEQ, VOCAB = 4, 256, 8192


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=12,
                                     n_head=4, use_cache=False, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    return model


def batch(b, device="cpu"):
    ids = torch.randint(0, VOCAB, (b, SEQ), generator=torch.Generator().manual_seed(b))
    return {"input_ids": ids.to(device), "labels": ids.clone().to(device)}


def measure(model, x):
    """(loss, gradients, bytes held after forward, peak bytes held)."""
    for p in model.parameters():
        p.grad = None
    skip = {t.untyped_storage()._cdata
            for t in list(model.parameters()) + list(model.buffers()) + list(x.values())}
    meter = SavedMeter(skip)
    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        loss = model(**x).loss
    held = meter.bytes
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, held, meter.peak


def step_seconds(model, x, steps):
    times = []
    for i in range(steps + 1):
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(1)
        start = time.perf_counter()
        model(**x).loss.backward()
        if i > 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    base = gpt2()
    with torch.device("meta"):
        shadow = transformers.GPT2LMHeadModel(base.config)
    description = tracing.describe(shadow, lambda b: batch(b, "meta"), attention="cpu",
                                   batches=(BATCH, BATCH + 1))
    x = batch(BATCH)
    ref_loss, ref_grads, _, _ = measure(base, x)

    rows = []

    def run(name, model, predicted=None, sees_peak=True):
        loss, grads, held, peak = measure(model, x)
        peak = peak if sees_peak else None
        exact = torch.equal(loss, ref_loss) and all(torch.equal(grads[n], g)
                                                    for n, g in ref_grads.items())
        rows.append((name, held, peak, predicted, step_seconds(model, x, args.steps), exact))

    run("no recomputation", copy.deepcopy(base))
    hf = copy.deepcopy(base)
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # torch.utils.checkpoint keeps what it recomputes away from the
    # saved-tensor hooks around it: its peak is not measured here.
    run("transformers gradient checkpointing (every block)", hf, sees_peak=False)
    for planner in ("full", "sqrt", "uniform:4"):
        config = {"train_micro_batch_size_per_gpu": BATCH,
                  "activation_checkpointing": {"planner": planner}}
        report = mt.plan(description, config=config, batch=BATCH)
        model = copy.deepcopy(base)
        Recomputation(model, segments_of(description, report))
        run("memwall %s" % planner, model, report["recompute_held_after_forward"])
    none_peak = mt.plan(description, batch=BATCH, config={
        "train_micro_batch_size_per_gpu": BATCH})["recompute_predicted_peak"]
    full_peak = mt.plan(description, batch=BATCH, config={
        "train_micro_batch_size_per_gpu": BATCH,
        "activation_checkpointing": {"planner": "full"}})["recompute_predicted_peak"]
    budget = (none_peak + full_peak) // 2
    report = mt.plan(description, batch=BATCH, config={
        "train_micro_batch_size_per_gpu": BATCH,
        "activation_checkpointing": {"planner": "optimal", "budget_bytes": budget}})
    model = copy.deepcopy(base)
    Recomputation(model, segments_of(description, report))
    run("memwall optimal, budget %.1f MiB" % (budget / 2**20), model,
        report["recompute_held_after_forward"])

    print("GPT-2 12 x 256, micro-batch %d, sequence %d, f32, CPU (%d threads); held: bytes "
          "autograd keeps once forward ends; peak: most it holds during the step (n/a: "
          "torch.utils.checkpoint's recomputed tensors bypass the hooks that measure)" % (
              BATCH, SEQ, torch.get_num_threads()))
    print("%-50s %11s %11s %11s %9s %8s %9s %s" % (
        "configuration", "held MiB", "peak MiB", "planned MiB", "held-plan", "step s", "vs none",
        "bit-exact"))
    none_time = rows[0][4]
    for name, held, peak, predicted, seconds, exact in rows:
        print("%-50s %11.2f %11s %11s %9s %8.3f %8.2fx %s" % (
            name, held / 2**20, "n/a" if peak is None else "%.2f" % (peak / 2**20),
            "-" if predicted is None else "%.2f" % (predicted / 2**20),
            "-" if predicted is None else "%+d B" % (held - predicted), seconds,
            seconds / none_time, "yes" if exact else "NO"))


if __name__ == "__main__":
    main()
