"""The PyTorch front end's figures, each against torch measured in the same run:

  step     a transformers GPT-2 trained on one process: step time (forward,
           backward, optimizer step) with torch.optim.AdamW vs
           memwall.torch.ZeroOptimizer at stages 0 and 3: the wrapper's
           overhead per step;
  ranks    the same model on 2 MPI ranks: torch DistributedDataParallel
           (gloo) with AdamW vs ZeroOptimizer at stages 0 and 3;
  adam     the optimizer step alone on one 16M-element f32 parameter:
           torch's CPU AdamW (foreach and fused) vs memwall's update on the
           host device and with the optimizer offloaded to the CPU (ratio 1),
           at 1 and 2 threads (torch.set_num_threads, MEMWALL_CPU_THREADS);
  memory   model-state bytes per rank from memwall's allocator, stages 0
           and 3 on 1, 2 and 4 ranks, next to the ZeRO formula;
  launchers  ZeroOptimizer stages 0 and 3 on 2 ranks started by mpirun vs by
           torchrun alone (memwall joins the MPI singletons: its MPI traffic
           goes over TCP, not shared memory), the launchers alternated over
           --rounds rounds: step time, and the ZeroOptimizer's construction
           (under torchrun, the join included);
  rss      each process's resident memory (VmRSS, and its peak VmHWM) on 2
           MPI ranks: after the imports, after building the optimizer, after
           3 training steps of the GPT-2 above, torch.optim.AdamW alone (a
           process per rank, no communication) vs ZeroOptimizer at stages 0
           and 3: what the front end costs beyond the model states.

Usage (after tools/python_env.sh):
  .venv/bin/python benchmarks/torch_frontend.py [--steps N] [--rounds R]
      [--parts step,ranks,adam,memory,rss,launchers]
Times are medians over --steps steps after 2 warm-up steps.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpt2(seed=0):
    import torch
    import transformers
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=2048, n_positions=128, n_embd=256, n_layer=4,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def batches(count, batch=8, seq=128, seed=1):
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (batch, seq), generator=g) for _ in range(count)]


def time_steps(model, opt, data, backward, share=None):
    """Median seconds per step, and of its optimizer step alone."""
    steps, opt_steps = [], []
    for i, tokens in enumerate(data):
        step, opt_step = one_step(model, opt, tokens if share is None else tokens[share],
                                  backward)
        if i >= 2:
            steps.append(step)
            opt_steps.append(opt_step)
    return statistics.median(steps), statistics.median(opt_steps)


def zero_config(stage):
    return {"zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}


def one_step(model, opt, tokens, backward):
    """Seconds of one step, and of its optimizer step alone."""
    start = time.perf_counter()
    loss = model(tokens, labels=tokens).loss
    backward(loss)
    mid = time.perf_counter()
    opt.step()
    opt.zero_grad()
    end = time.perf_counter()
    return end - start, end - mid


def part_step(steps):
    import torch
    import memwall.torch as mt
    torch.set_num_threads(1)
    data = batches(steps + 2)
    runs = []
    model = gpt2()
    runs.append(("torch.optim.AdamW (foreach)", model,
                 torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01), None))
    for stage in (0, 3):
        model = gpt2()
        opt = mt.ZeroOptimizer(model, None, zero_config(stage))
        runs.append(("ZeroOptimizer stage %d" % stage, model, opt, opt.backward))
    # The runs take turns step by step, so that the machine's drift (this
    # VM's throughput wanders by tens of percent) falls on all of them.
    times = [([], []) for _ in runs]
    for i, tokens in enumerate(data):
        for (name, model, opt, backward), (step_times, opt_times) in zip(runs, times):
            step, opt_step = one_step(model, opt, tokens,
                                      backward or (lambda loss: loss.backward()))
            if i >= 2:
                step_times.append(step)
                opt_times.append(opt_step)
    params = sum(p.numel() for p in gpt2().parameters())
    print("step: GPT-2 (%.2fM parameters, 4 layers, d 256, vocab 2048), batch 8 x 128 tokens, "
          "f32, 1 thread, median of %d steps, the three runs taking turns" % (params / 1e6, steps))
    base = statistics.median(times[0][0])
    print("  %-32s %10s %12s %10s" % ("optimizer", "step ms", "opt.step ms", "vs torch"))
    for (name, _, _, _), (step_times, opt_times) in zip(runs, times):
        step = statistics.median(step_times)
        print("  %-32s %10.1f %12.1f %+9.1f%%" % (name, step * 1e3,
                                                 statistics.median(opt_times) * 1e3,
                                                 (step / base - 1) * 100))


def rank_worker(kind, steps, out):
    """One rank of the `ranks` and `launchers` parts (under mpirun or
    torchrun); rank 0 writes [step, opt.step, construction] seconds."""
    import torch
    import memwall.torch as mt
    torch.set_num_threads(1)
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    else:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    share = slice(rank * 8 // world, (rank + 1) * 8 // world)
    data = batches(steps + 2)
    model = gpt2()
    if kind == "ddp":
        torch.distributed.init_process_group("gloo", init_method="file://" + out + ".rendezvous",
                                             rank=rank, world_size=world)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        result = time_steps(ddp, opt, data, lambda l: l.backward(), share)
    else:
        start = time.perf_counter()
        opt = mt.ZeroOptimizer(model, None, zero_config(int(kind)))
        made = time.perf_counter() - start
        result = time_steps(model, opt, data, opt.backward, share) + (made,)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    if kind == "ddp":
        torch.distributed.destroy_process_group()


def clean_env():
    """The environment without what Open MPI added when this process ran a
    ZeroOptimizer itself (a singleton rank): a child mpirun that saw it
    would fail."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}


def spawn(ranks, *args):
    command = [os.path.join(ROOT, "tools", "mpirun.sh"), str(ranks), sys.executable,
               os.path.abspath(__file__)] + [str(a) for a in args]
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(command), done.stderr[-3000:]))


def part_ranks(steps):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, name in (("ddp", "torch DDP (gloo) + AdamW"), ("0", "ZeroOptimizer stage 0"),
                           ("3", "ZeroOptimizer stage 3")):
            out = os.path.join(tmp, kind + ".json")
            spawn(2, "--worker", kind, "--steps", steps, "--out", out)
            with open(out) as f:
                rows.append((name,) + tuple(json.load(f))[:2])
    print("ranks: the same GPT-2 on 2 MPI ranks (4 sequences each), 1 thread per rank, "
          "median of %d steps, rank 0's times" % steps)
    base = rows[0][1]
    print("  %-32s %10s %12s %10s" % ("optimizer", "step ms", "opt.step ms", "vs DDP"))
    for name, step, opt_step in rows:
        print("  %-32s %10.1f %12.1f %+9.1f%%" % (name, step * 1e3, opt_step * 1e3,
                                                 (step / base - 1) * 100))


def adam_worker(kind, threads, steps, out):
    """Times the optimizer step on one 16M-element parameter (a process per
    measurement: MEMWALL_CPU_THREADS is read once)."""
    import torch
    import memwall.torch as mt
    torch.set_num_threads(threads)
    n = 1 << 24
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(n) * 0.02)
    direction = torch.randn(n)
    if kind in ("foreach", "fused"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                                foreach=kind == "foreach", fused=kind == "fused" or None)
        backward = lambda loss: loss.backward()
    else:
        config = zero_config(1 if kind == "offload" else 0)
        if kind == "offload":
            config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        opt = mt.ZeroOptimizer(model, None, config, device_memory="2GiB", pinned_memory="2GiB")
        backward = opt.backward
    times = []
    for i in range(steps + 2):
        backward((model.w * direction).sum())
        start = time.perf_counter()
        opt.step()
        opt.zero_grad()
        if i >= 2:
            times.append(time.perf_counter() - start)
    with open(out, "w") as f:
        json.dump(statistics.median(times), f)


def part_adam(steps):
    print("adam: one optimizer step on 16.8M f32 parameters (AdamW), median of %d steps" % steps)
    print("  %-44s %10s %10s" % ("update", "1 thread", "2 threads"))
    kinds = (("foreach", "torch AdamW foreach"), ("fused", "torch AdamW fused"),
             ("device", "ZeroOptimizer stage 0 (host device)"),
             ("offload", "ZeroOptimizer stage 1, offload cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for threads in (1, 2):
            for kind, _ in kinds:
                out = os.path.join(tmp, "%s-%d.json" % (kind, threads))
                env = dict(clean_env(), MEMWALL_CPU_THREADS=str(threads))
                subprocess.run([sys.executable, os.path.abspath(__file__), "--adam-worker", kind,
                                "--threads", str(threads), "--steps", str(steps), "--out", out],
                               check=True, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                with open(out) as f:
                    results[kind, threads] = json.load(f)
    for kind, name in kinds:
        print("  %-44s %8.1fms %8.1fms" % (name, results[kind, 1] * 1e3, results[kind, 2] * 1e3))


def memory_worker(stage, out):
    import memwall.torch as mt
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    model = gpt2()
    opt = mt.ZeroOptimizer(model, None, {**zero_config(stage), "bf16": {"enabled": True}})
    memory = opt.memory()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"memory": {c: memory[c]["current"] for c in
                                  ("parameter", "gradient", "optimizer_state")},
                       "padded": sum(g["padded_numel"] for g in opt.engine.groups())}, f)


def part_memory():
    print("memory: model-state bytes per rank at rest (GPT-2 above, bf16 AdamW), from memwall's "
          "allocator; formula 16P (stage 0), 16P/N (stage 3), P = padded elements")
    print("  %-6s %-6s %12s %12s %12s %12s %12s" % ("ranks", "stage", "parameter", "gradient",
                                                   "optimizer", "total", "formula"))
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, 2, 4):
            for stage in (0, 3):
                out = os.path.join(tmp, "m%d%d.json" % (ranks, stage))
                spawn(ranks, "--memory-worker", stage, "--out", out)
                with open(out) as f:
                    r = json.load(f)
                m = r["memory"]
                total = sum(m.values())
                formula = 16 * r["padded"] // (ranks if stage == 3 else 1)
                print("  %-6d %-6d %12d %12d %12d %12d %12d" % (
                    ranks, stage, m["parameter"], m["gradient"], m["optimizer_state"], total,
                    formula))


def resident_mib():
    """(VmRSS, VmHWM) of this process in MiB."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def rss_worker(kind, out):
    """One rank of the `rss` part: its resident memory at each phase."""
    import torch
    import transformers  # noqa: F401 (what a Trainer user's script imports)
    if kind != "torch":
        import memwall.torch as mt
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    torch.set_num_threads(1)
    phases = {"imported": resident_mib()[0]}
    model = gpt2()
    phases["model built"] = resident_mib()[0]
    if kind == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    else:
        opt = mt.ZeroOptimizer(model, None, zero_config(int(kind)))
    phases["optimizer built"] = resident_mib()[0]
    for tokens in batches(3, batch=4):
        opt.zero_grad()
        model(tokens, labels=tokens).loss.backward()
        opt.step()
    phases["3 steps"], peak = resident_mib()
    phases["peak"] = peak
    states = 0
    if kind != "torch":
        memory = opt.memory()
        states = sum(memory[c]["current"] for c in ("parameter", "gradient", "optimizer_state"))
    with open("%s.rank%d" % (out, rank), "w") as f:
        json.dump({"phases": phases, "states": states}, f)


def part_rss():
    kinds = (("torch", "torch AdamW"), ("0", "ZeroOptimizer stage 0"),
             ("3", "ZeroOptimizer stage 3"))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, _ in kinds:
            out = os.path.join(tmp, kind)
            spawn(2, "--rss-worker", kind, "--out", out)
            rows[kind] = []
            for rank in (0, 1):
                with open("%s.rank%d" % (out, rank)) as f:
                    rows[kind].append(json.load(f))
    phases = list(rows["torch"][0]["phases"])
    print("rss: resident MiB per rank on 2 MPI ranks (rank 0 / rank 1), GPT-2 above, "
          "4 sequences a step; model states in memwall's allocator last")
    print("  %-24s" % "" + "".join(" %17s" % p for p in phases) + " %12s" % "states MiB")
    for kind, name in kinds:
        cells = "".join(" %8.0f /%7.0f" % tuple(r["phases"][p] for r in rows[kind])
                        for p in phases)
        print("  %-24s%s %12.1f" % (name, cells, rows[kind][0]["states"] / 2**20))
    for kind, name in kinds[1:]:
        extra = [rows[kind][r]["phases"]["3 steps"] - rows["torch"][r]["phases"]["3 steps"]
                 for r in (0, 1)]
        print("  %s after 3 steps vs torch AdamW: %+.0f / %+.0f MiB" % ((name,) + tuple(extra)))


def spawn_torchrun(ranks, *args):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(ranks), os.path.abspath(__file__)] + [str(a) for a in args]
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(command), done.stderr[-3000:]))


def part_launchers(steps, rounds):
    runs = [(launcher, stage) for stage in ("0", "3") for launcher in ("mpirun", "torchrun")]
    figures = {run: [] for run in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for launcher, stage in runs:
                out = os.path.join(tmp, "%s%s.json" % (launcher, stage))
                (spawn if launcher == "mpirun" else spawn_torchrun)(
                    2, "--worker", stage, "--steps", steps, "--out", out)
                with open(out) as f:
                    figures[(launcher, stage)].append(json.load(f))
    print("launchers: the GPT-2 above on 2 ranks (4 sequences each), 1 thread per rank, rank 0's "
          "median step of %d, medians over %d rounds (launchers alternated)" % (steps, rounds))
    print("  %-8s %-9s %10s %12s %14s %10s" % ("stage", "launcher", "step ms", "opt.step ms",
                                               "construct s", "vs mpirun"))
    for launcher, stage in runs:
        step, opt_step, made = (statistics.median(f[i] for f in figures[(launcher, stage)])
                                for i in range(3))
        base = statistics.median(f[0] for f in figures[("mpirun", stage)])
        print("  %-8s %-9s %10.1f %12.1f %14.2f %+9.1f%%" % (
            stage, launcher, step * 1e3, opt_step * 1e3, made, (step / base - 1) * 100))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--parts", default="step,ranks,adam,memory,rss,launchers")
    parser.add_argument("--rounds", type=int, default=3, help="launchers: alternations")
    parser.add_argument("--worker")
    parser.add_argument("--adam-worker")
    parser.add_argument("--memory-worker", type=int)
    parser.add_argument("--rss-worker")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        return rank_worker(args.worker, args.steps, args.out)
    if args.adam_worker:
        return adam_worker(args.adam_worker, args.threads, args.steps, args.out)
    if args.memory_worker is not None:
        return memory_worker(args.memory_worker, args.out)
    if args.rss_worker:
        return rss_worker(args.rss_worker, args.out)
    parts = args.parts.split(",")
    if "step" in parts:
        part_step(args.steps)
    if "ranks" in parts:
        part_ranks(args.steps)
    if "adam" in parts:
        part_adam(args.steps)
    if "memory" in parts:
        part_memory()
    if "rss" in parts:
        part_rss()
    if "launchers" in parts:
        part_launchers(args.steps, args.rounds)


if __name__ == "__main__":
    main()
