"""Training quality with ZeRO++ against exact ZeRO-3, on a reference nobody
here wrote: a transformers GPT-2 (4 layers, d 256, 4 heads, byte vocabulary,
dropout off) trained through memwall.torch.ZeroOptimizer on 4 MPI ranks
posed as 2 nodes of 2 (the config's ranks_per_node), on the bytes of this
repository's documentation (every rank its own sequences), the same seed
and data for every configuration:

  stage 3                exact
  bf16 reductions        stage 3 with communication_data_type bf16: a
                         lossy setting users accept, for scale
  stage 3 + qwZ          zero_quantized_weights (int8 gathers, block 2048)
  stage 3 + hpZ          zero_hpz_partition_size 2 (exact)
  stage 3 + qgZ          zero_quantized_gradients (int8 across nodes)
  ZeRO++                 all three
  stage 0                unsharded data parallelism (exact)
  hybrid                 mics_shard_size 2: stage 3 inside each node,
                         replicated across the nodes (exact)

Prints each run's loss (the ranks' mean) every 25 steps side by side, the
final loss (the mean of the last 10 steps) and its difference from stage 3's,
and the bytes per step across nodes (opt.communication()). With --seeds N
each configuration runs N times (model and data from seeds 0..N-1, or
from --first_seed on) and the
final losses are compared seed by seed: each one's difference from stage 3
on the same seed, their mean and range.

With --heldout F the corpus' last fraction F is kept out of training and
the final loss is the loss on it after the last step (every 128-byte window
of it, split between the ranks, evaluated under torch.no_grad): the same
bytes for every run, where the last steps' training loss is a handful of
batches. --schedule cosine warms the learning rate up linearly over the
first 10% of the steps and decays it by a half cosine to a tenth
(torch.optim.lr_scheduler.LambdaLR on the ZeroOptimizer), as GPT-2-style
training does; --batch sets the sequences per rank per step.

Usage (after tools/python_env.sh):
  .venv/bin/python benchmarks/zeropp_quality.py [--steps 300] [--seeds N]
      [--runs "stage 3,ZeRO++"] [--block B] [--batch 2] [--heldout 0.1]
      [--schedule constant|cosine] [--first_seed F] [--corpus_commit REV]

The corpus is this repository's README and RESULTS as the working tree
holds them when the command starts, or as git commit REV holds them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = [("stage 3", {}),
        # An accepted lossy setting, for scale: gradients reduced in bf16.
        ("bf16 reductions", {"top": {"communication_data_type": "bf16"}}),
        ("stage 3 + qwZ", {"zero_quantized_weights": True}),
        ("stage 3 + hpZ", {"zero_hpz_partition_size": 2}),
        ("stage 3 + qgZ", {"zero_quantized_gradients": True}),
        ("ZeRO++", {"zero_quantized_weights": True, "zero_hpz_partition_size": 2,
                    "zero_quantized_gradients": True}),
        ("stage 0", {"stage": 0}),
        ("hybrid", {"mics_shard_size": 2})]
RANKS, PER_NODE = 4, 2
SEQ = 128


def corpus(commit):
    """The documentation's bytes, read once by the parent (the workers of
    every run read its copy: an edit mid-run changes no run's data); with a
    commit, the two files as that commit holds them, so that runs made
    sessions apart train and evaluate on the same bytes."""
    text = b""
    for name in ("README.md", "benchmarks/RESULTS.md"):
        if commit:
            text += subprocess.run(["git", "-C", ROOT, "show", "%s:%s" % (commit, name)],
                                   check=True, stdout=subprocess.PIPE).stdout
        else:
            with open(os.path.join(ROOT, name), "rb") as f:
                text += f.read()
    return text


def worker(out, zero_json, corpus_path, seed, args):
    """One rank of one run (under mpirun)."""
    import math
    import torch
    import transformers
    import memwall.torch as mt
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=256, n_layer=4,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    zero = dict({"stage": 3}, **json.loads(zero_json))
    top = zero.pop("top", {})  # keys outside zero_optimization
    opt = mt.ZeroOptimizer(model, None, dict({
        "zero_optimization": zero, "ranks_per_node": PER_NODE, "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}, **top))
    rank, world = opt.engine.rank, opt.engine.world_size
    with open(corpus_path, "rb") as f:
        everything = torch.tensor(list(f.read()), dtype=torch.long)
    split = len(everything) - int(len(everything) * args.heldout)
    data, heldout = everything[:split], everything[split:]
    steps, batch = args.steps, args.batch
    if args.schedule == "cosine":
        warmup = max(1, steps // 10)
        def factor(step):
            if step < warmup:
                return (step + 1) / warmup
            return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    g = torch.Generator().manual_seed(1234 + seed)
    losses = []
    start = opt.communication()["inter_node_bytes"]
    for step in range(steps):
        offsets = torch.randint(0, len(data) - SEQ, (world * batch,), generator=g)
        mine = offsets[rank * batch:(rank + 1) * batch]
        ids = torch.stack([data[o:o + SEQ] for o in mine.tolist()])
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.schedule == "cosine":
            schedule.step()
        losses.append(loss.item())
    across = (opt.communication()["inter_node_bytes"] - start) / steps
    # The held-out windows, the same number on every rank (stage 3 gathers
    # the weights in each forward: every rank runs as many).
    windows = heldout[:len(heldout) // (SEQ * world) * SEQ * world].view(-1, SEQ)
    total = 0.0
    with torch.no_grad():
        for ids in windows[rank::world].split(8):
            total += model(ids, labels=ids).loss.item() * len(ids)
    evaluated = total / max(1, len(windows) // world)
    with open("%s.rank%d" % (out, rank), "w") as f:
        json.dump({"losses": losses, "across": across, "heldout": evaluated,
                   "windows": len(windows)}, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--block", type=int, default=0,
                        help="zero_quantization_block_size for the quantized runs (0: memwall's)")
    parser.add_argument("--runs", default="",
                        help="comma-separated run names to take (default: all)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="runs of each configuration, from seeds F..F+N-1")
    parser.add_argument("--first_seed", type=int, default=0, help="F above")
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--heldout", type=float, default=0.0,
                        help="the corpus' last fraction kept out of training; the final loss "
                             "is the loss on it (0: the last 10 steps' training loss)")
    parser.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    parser.add_argument("--corpus_commit", default="",
                        help="read README.md and benchmarks/RESULTS.md as this git commit holds "
                             "them (default: the working tree's)")
    parser.add_argument("--worker", nargs=4)
    args = parser.parse_args()
    if not 0 <= args.heldout < 1:
        parser.error("--heldout: expected a fraction in [0, 1), got %r" % args.heldout)
    if args.worker:
        worker(args.worker[0], args.worker[1], args.worker[2], int(args.worker[3]), args)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = os.path.join(tmp, "corpus.bin")
        with open(corpus_path, "wb") as f:
            f.write(corpus(args.corpus_commit))
        runs = [(name, dict(zero)) for name, zero in RUNS
                if not args.runs or name in args.runs.split(",")]
        for name, zero in runs:
            if args.block and any(k.startswith("zero_quantized") for k in zero):
                zero["zero_quantization_block_size"] = args.block
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for i, (name, zero) in enumerate(runs):
                out = os.path.join(tmp, "run%d-%d" % (i, seed))
                subprocess.run([os.path.join(ROOT, "tools", "mpirun.sh"), str(RANKS),
                                sys.executable, os.path.abspath(__file__), "--worker", out,
                                json.dumps(zero), corpus_path, str(seed), "--steps",
                                str(args.steps), "--batch", str(args.batch), "--heldout",
                                str(args.heldout), "--schedule", args.schedule],
                               check=True, env=env)
                ranks = []
                for r in range(RANKS):
                    with open("%s.rank%d" % (out, r)) as f:
                        ranks.append(json.load(f))
                mean = [sum(x) / RANKS for x in zip(*(rk["losses"] for rk in ranks))]
                heldout = sum(rk["heldout"] for rk in ranks) / RANKS
                windows = ranks[0]["windows"]
                results.append((name, seed, mean, ranks[0]["across"], heldout))
                print("%s, seed %d: done" % (name, seed), file=sys.stderr, flush=True)
    print("zeropp_quality: GPT2LMHeadModel (4 layers, d 256, byte vocabulary), f32, %d ranks "
          "as %d nodes of %d, %d x %d tokens per rank per step, AdamW lr 1e-3 (%s), %d steps" %
          (RANKS, RANKS // PER_NODE, PER_NODE, args.batch, SEQ,
           "constant" if args.schedule == "constant" else
           "10% linear warm-up, half-cosine decay to 1e-4", args.steps))
    what = ("the mean of the last 10 steps" if not args.heldout else
            "held out: the corpus' last %g, %d windows of %d bytes" % (args.heldout, windows, SEQ))
    def final(result):
        if args.heldout:
            return result[4]
        return sum(result[2][-10:]) / len(result[2][-10:])
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        mine = [r for r in results if r[1] == seed]
        print("seed %d:" % seed)
        print("  %6s  %s" % ("step", "  ".join("%14s" % r[0] for r in mine)))
        for s in list(range(0, args.steps, 25)) + [args.steps - 1]:
            print("  %6d  %s" % (s + 1, "  ".join("%14.4f" % r[2][s] for r in mine)))
        base, base_across = final(mine[0]), mine[0][3]
        print("  final loss (%s), vs %s; bytes per step across nodes:" % (what, mine[0][0]))
        for r in mine:
            print("  %-16s %.4f  %+.2f%%  %.2f MiB (%.2fx %s's)" % (
                r[0], final(r), (final(r) / base - 1) * 100, r[3] / 2**20,
                r[3] / base_across, mine[0][0]))
    if args.seeds > 1:
        print("over %d seeds, each final loss against %s's on the same seed:"
              % (args.seeds, results[0][0]))
        for name, _ in runs:
            diffs = [(final(r) / final(b) - 1) * 100
                     for r in results if r[0] == name
                     for b in results if b[0] == runs[0][0] and b[1] == r[1]]
            print("  %-16s mean %+.2f%%  range %+.2f%% .. %+.2f%%  (%s)" % (
                name, sum(diffs) / len(diffs), min(diffs), max(diffs),
                ", ".join("%+.2f%%" % d for d in diffs)))


if __name__ == "__main__":
    main()
