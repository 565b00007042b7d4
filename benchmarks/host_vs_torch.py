"""Host training throughput, memwall against torch, on one CPU thread each.

memwall: `memwall train --model gpt2-124m:layers=2,seq=256` (the host
backend, f32, AdamW, ZeRO stage 0, micro-batch 2), with the OpenBLAS kernel
set in force as memwall runs it, and once more forced to OpenBLAS's generic
one (OPENBLAS_CORETYPE=Prescott: what Debian's OpenBLAS 0.3.21 runs on a
CPU it does not know, unless memwall chooses). torch: transformers'
GPT2LMHeadModel of the same shape (2 layers, 768 wide, 12 heads, 50257
tokens, sequence 256, no dropout) under torch.optim.AdamW, micro-batch 2,
torch.set_num_threads(1). The rounds alternate the three; each prints
tokens/s over its steps after one warm-up step, and the medians and ratios
end the output.

    bazel build //cli:memwall
    .venv/bin/python benchmarks/host_vs_torch.py [--steps 6] [--rounds 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMWALL = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
SEQ, MICRO = 256, 2


def memwall(steps, core):
    """memwall's tokens/s over `steps` steps (its summary), and its BLAS line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env.update(OPENBLAS_NUM_THREADS="1", MEMWALL_CPU_THREADS="1")
    if core:
        env["OPENBLAS_CORETYPE"] = core
    config = os.path.join(ROOT, "benchmarks", ".host_vs_torch.json")
    with open(config, "w") as f:
        f.write('{"train_micro_batch_size_per_gpu": %d, "optimizer": {"type": "AdamW", '
                '"params": {"lr": 0.001}}, "zero_optimization": {"stage": 0}}' % MICRO)
    try:
        done = subprocess.run([MEMWALL, "train", "--model", "gpt2-124m:layers=2,seq=%d" % SEQ,
                               "--config", config, "--steps", str(steps + 1), "--log_every",
                               "1", "--device_memory", "8GiB", "--log_format", "json"],
                              capture_output=True, text=True, env=env, check=True)
    finally:
        os.remove(config)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    blas = next(r["blas"] for r in records if r.get("event") == "start")
    per_step = [r["tokens_per_s"] for r in records if r.get("event") == "step"]
    # The first step warms up; the rest by their mean time.
    seconds = sum(SEQ * MICRO / t for t in per_step[1:])
    return SEQ * MICRO * (len(per_step) - 1) / seconds, blas


def torch_run(steps):
    import torch
    import transformers
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50257, n_positions=SEQ, n_embd=768, n_layer=2, n_head=12, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    ids = torch.randint(0, 256, (MICRO, SEQ), generator=torch.Generator().manual_seed(1))
    took = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
        took.append(time.perf_counter() - start)
    return SEQ * MICRO * steps / sum(took[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds: expected >= 1")
    rows = {"memwall": [], "memwall, generic kernel": [], "torch": []}
    blas = {}
    print("host_vs_torch: gpt2-124m:layers=2,seq=%d, micro-batch %d, f32 AdamW, one thread, "
          "%d steps a run after one warm-up, %d rounds" % (SEQ, MICRO, args.steps, args.rounds))
    for r in range(args.rounds):
        tokens, blas["memwall"] = memwall(args.steps, None)
        rows["memwall"].append(tokens)
        tokens, blas["memwall, generic kernel"] = memwall(args.steps, "Prescott")
        rows["memwall, generic kernel"].append(tokens)
        # torch in a process of its own, as memwall runs, so neither warms
        # the other's caches or allocator.
        out = subprocess.run([sys.executable, __file__, "--torch-only", str(args.steps)],
                             capture_output=True, text=True, check=True).stdout
        rows["torch"].append(float(out))
        print("round %d: %s" % (r + 1, ", ".join("%s %.1f tokens/s" % (k, v[-1])
                                                  for k, v in rows.items())))
    for name, core in blas.items():
        print("%s: BLAS %s" % (name, core))
    medians = {k: statistics.median(v) for k, v in rows.items()}
    for name, m in medians.items():
        print("median %-24s %8.1f tokens/s  %.2fx torch" % (name, m, m / medians["torch"]))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-only":
        print(torch_run(int(sys.argv[2])))
    else:
        main()
