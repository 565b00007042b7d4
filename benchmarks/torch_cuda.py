"""memwall.torch on the GPU against torch's own optimizer, the same model,
data and precision (bf16 parameters, f32 master weights), runs interleaved
and each figure the median of its steps after warm-up:

  torch fused        torch's mixed precision: an f32 model run under
                     torch.autocast(bf16), torch.optim.AdamW(fused=True) on
                     its f32 parameters (the baseline: torch's fastest
                     optimizer; the same 16 bytes of model state per
                     parameter as memwall's 2 + 2 + 12)
  memwall stage S    memwall.torch.ZeroOptimizer, stages 0, 1 and 2, on one
                     GPU (its update: memwall's CUDA Adam kernel)
  offload            stage 2, optimizer states in pinned host memory, the
                     update on the CPU after backward
  offload+overlap    the same, the update overlapped with backward
                     (offload_optimizer.overlap_step)

For each: the whole training step (forward, backward, step) and the
optimizer step alone (opt.step(), CUDA events around it), the device
memory (torch's max_memory_allocated plus the engine allocator's peak).
The offloaded runs are bounded by max(backward, the CPU update with its
transfers) after forward: the bound is computed from the on-device stage
2 run's forward and backward and the non-overlapped offload run's step,
and the overlapped run's step time is reported against it.

--largest instead: the largest GPT-2-shaped model (width --d, heads of
64, sequence --seq, micro-batch 1, bf16, stage 2, one GPU) that trains
through memwall.torch on this GPU: memwall.torch.plan's prediction (the
deepest model whose plan fits the GPU's free memory; with optimizer
offload, also the host's), then real steps from that depth up and down
(the model built on the CPU and handed over, an out-of-memory error a
miss). With offload, one step at the first depth the GPU could not train
without it, and the predicted deepest, not tried (its host copy alone
would take minutes).

--device_memory caps the engine's allocator (the offloaded runs take the
cap: a model whose states do not fit it on the device trains offloaded).
CPU mode (--cpu, or no GPU): the same code on the host backend with a
tiny model, to rehearse the script; its figures are not GPU figures.

Usage: python benchmarks/torch_cuda.py [--layers 12] [--d 768] [--seq 1024]
    [--batch 4] [--steps 12] [--warmup 3] [--device_memory 60GiB]
    [--runs "torch fused,memwall stage 0,..."] [--cpu] [--json OUT]
  python benchmarks/torch_cuda.py --largest [--d 1600] [--seq 1024] [--json OUT]
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers

import memwall.torch as mt

RUNS = ["torch fused", "memwall stage 0", "memwall stage 1", "memwall stage 2", "offload",
        "offload+overlap"]


def model_config(args):
    return transformers.GPT2Config(n_embd=args.d, n_layer=args.layers, n_head=max(1, args.d // 64),
                                   n_positions=args.seq, vocab_size=50257 if not args.cpu else 512,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


class Timer:
    """Wall time of device work: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, cuda):
        self.cuda = cuda

    def start(self):
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self):
        """Seconds since start (synchronises)."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return self.begin.elapsed_time(end) / 1e3
        return time.perf_counter() - self.begin


def zero_config(run, args):
    stage = 2 if run.startswith("offload") else int(run.rsplit(" ", 1)[1])
    zero = {"stage": stage}
    if run.startswith("offload"):
        zero["offload_optimizer"] = {"device": "cpu", "overlap_step": run == "offload+overlap"}
        zero["reduce_bucket_size"] = 5e7  # several groups: the overlap needs them
    return {"zero_optimization": zero, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}


def run_once(run, args, device, ids):
    """One run of `steps` steps: per-step times (total, forward, backward,
    step) and memory."""
    torch.manual_seed(0)
    with device:
        model = transformers.GPT2LMHeadModel(model_config(args))
    cuda = device.type == "cuda"
    baseline = run == "torch fused"
    if baseline:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
    else:
        opt = mt.ZeroOptimizer(model, None, zero_config(run, args),
                               backend="cuda" if cuda else "host",
                               device_memory=args.device_memory)
    timer = Timer(cuda)
    times = {"total": [], "forward": [], "backward": [], "step": []}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    for i in range(args.warmup + args.steps):
        timer.start()
        begin = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=baseline):
            loss = model(ids, labels=ids).loss
        forward = timer.stop()
        timer.start()
        loss.backward()
        backward = timer.stop()
        timer.start()
        opt.step()
        opt.zero_grad()
        step = timer.stop()
        total = time.perf_counter() - begin
        if i >= args.warmup:
            for key, value in (("total", total), ("forward", forward), ("backward", backward),
                               ("step", step)):
                times[key].append(value)
    medians = {k: statistics.median(v) for k, v in times.items()}
    memory = (torch.cuda.max_memory_allocated() - base) if cuda else 0
    if not baseline:
        memory += opt.engine.requested_peak
    medians["device_bytes"] = memory
    medians["loss"] = loss.item()
    del opt, model
    if cuda:
        torch.cuda.empty_cache()
    return medians


def largest_config(offload):
    zero = {"stage": 2}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"zero_optimization": zero, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


def host_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def largest(args):
    """--largest: predicted and measured depths, printed and returned."""
    cuda = not args.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    # CPU mode, a rehearsal: 8 MiB beyond the 1 GiB plan keeps for the runtime.
    free = torch.cuda.mem_get_info(0)[0] if cuda else (1 << 30) + (8 << 20)
    host = host_bytes()

    def shape(layers):
        return transformers.GPT2Config(n_embd=args.d, n_head=max(1, args.d // 64),
                                       n_layer=layers, n_positions=args.seq,
                                       vocab_size=50257 if cuda else 512)

    def predicted(offload):
        def fits(layers):
            return mt.plan(shape(layers), seq=args.seq, batch=1, config=largest_config(offload),
                           device_memory="%dB" % free, host_memory="%dB" % host)["fits"]
        lo, hi = 0, 1
        while fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def trains(layers, offload):
        """One training step at this depth; the seconds it took, or None."""
        torch.manual_seed(0)
        model = opt = None
        try:
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the CPU
            try:
                model = transformers.GPT2LMHeadModel(shape(layers))
            finally:
                torch.set_default_dtype(default)
            opt = mt.ZeroOptimizer(model, None, largest_config(offload),
                                   backend="cuda" if cuda else "host",
                                   device_memory="%dB" % free)
            ids = torch.randint(0, shape(layers).vocab_size, (1, args.seq)).to(device)
            begin = time.perf_counter()
            opt.backward(model(ids, labels=ids).loss)
            opt.step()
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - begin
        except (torch.OutOfMemoryError, MemoryError) as error:
            print("  %d layers%s: out of memory (%s)" % (
                layers, " offloaded" if offload else "", str(error).split("\n")[0][:160]))
            return None
        finally:
            del model, opt
            if cuda:
                torch.cuda.empty_cache()

    def params(layers):
        d, v = args.d, shape(layers).vocab_size
        return layers * (12 * d * d + 13 * d) + v * d + args.seq * d + 2 * d

    out = {"free_bytes": free, "host_bytes": host}
    on = predicted(False)
    print("largest: GPU free %.1f GiB, host available %.1f GiB; GPT-2 d %d, seq %d, micro-batch 1, "
          "bf16, stage 2" % (free / 2**30, host / 2**30, args.d, args.seq))
    print("predicted on the GPU: %d layers (%.2fB parameters)" % (on, params(on) / 1e9))
    step = max(1, on // 16)
    tried = {}
    layers = on
    while True:
        tried[layers] = trains(layers, False)
        print("  %d layers: %s" % (layers, "%.2f s a step" % tried[layers]
                                   if tried[layers] is not None else "does not train"))
        if tried[layers] is not None:
            if layers + step in tried or len(tried) >= 4:
                break
            layers += step
        else:
            if layers - step in tried or layers - step < 1 or len(tried) >= 4:
                break
            layers -= step
    good = [layer for layer, t in tried.items() if t is not None]
    measured = max(good) if good else 0
    print("measured on the GPU: %d layers (%.2fB parameters) train; predicted %d" % (
        measured, params(measured) / 1e9, on))
    out.update(predicted=on, measured=measured, tried=tried)
    off = predicted(True)
    print("predicted with optimizer offload: %d layers (%.2fB parameters; not tried)" % (
        off, params(off) / 1e9))
    beyond = min(tried) if not good else max(good) + step
    took = trains(beyond, True) if beyond <= off else None
    print("with optimizer offload, %d layers (%.2fB parameters, beyond the GPU alone): %s" % (
        beyond, params(beyond) / 1e9, "%.2f s a step" % took if took is not None else
        "does not train" if beyond <= off else "not tried (beyond the offload prediction)"))
    out.update(offload_predicted=off, offload_tried=beyond, offload_step_s=took)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--seq", type=int, default=1024)
    # 4: `memwall train --model gpt2-124m`'s micro-batch in the device
    # script, so the "torch fused" row's tokens/s sits beside its figure.
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds of every run (medians over all)")
    parser.add_argument("--device_memory", default="60GiB")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--json", default="")
    parser.add_argument("--largest", action="store_true")
    args = parser.parse_args()
    args.cpu = args.cpu or not torch.cuda.is_available()
    if args.largest:
        if args.cpu:
            args.d, args.seq = min(args.d, 64), min(args.seq, 64)
        result = largest(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "largest": result}, f, indent=1)
        return
    if args.cpu:
        args.layers, args.d, args.seq, args.batch = min(args.layers, 2), min(args.d, 64), \
            min(args.seq, 64), min(args.batch, 2)
        args.device_memory = "1GiB"
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    runs = [r.strip() for r in args.runs.split(",")]
    for r in runs:
        if r not in RUNS:
            sys.exit("--runs: unknown run %r (expected some of %s)" % (r, ", ".join(RUNS)))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model_config(args).vocab_size, (args.batch, args.seq),
                        generator=g).to(device)
    name = ("GPU %s" % torch.cuda.get_device_name(0)) if not args.cpu else "CPU mode (host backend)"
    print("torch_cuda: %s; GPT-2 %d layers, d %d, seq %d, batch %d, bf16; %d steps after %d "
          "warm-up, %d interleaved rounds; torch %s" % (
              name, args.layers, args.d, args.seq, args.batch, args.steps, args.warmup,
              args.rounds, torch.__version__))
    results = {r: [] for r in runs}
    for _ in range(args.rounds):
        for r in runs:
            results[r].append(run_once(r, args, device, ids))
    summary = {}
    for r in runs:
        summary[r] = {k: statistics.median(x[k] for x in results[r]) for k in results[r][0]}
    base = summary.get("torch fused")
    print("%-16s %9s %9s %9s %9s %8s %8s %10s %9s %8s" % (
        "run", "step ms", "fwd ms", "bwd ms", "opt ms", "x step", "x opt", "device GiB",
        "tokens/s", "loss"))
    for r in runs:
        s = summary[r]
        ratio = ("%8.3f" % (s["total"] / base["total"])) if base else "%8s" % "-"
        opt_ratio = ("%8.3f" % (s["step"] / base["step"])) if base else "%8s" % "-"
        s["tokens_per_s"] = args.batch * args.seq / s["total"]
        print("%-16s %9.2f %9.2f %9.2f %9.2f %s %s %10.2f %9.0f %8.4f" % (
            r, 1e3 * s["total"], 1e3 * s["forward"], 1e3 * s["backward"], 1e3 * s["step"],
            ratio, opt_ratio, s["device_bytes"] / 2**30, s["tokens_per_s"], s["loss"]))
    if "memwall stage 2" in summary and "offload" in summary and "offload+overlap" in summary:
        on, off, over = summary["memwall stage 2"], summary["offload"], summary["offload+overlap"]
        bound = on["forward"] + max(on["backward"], off["step"])
        summary["offload bound"] = bound
        print("offload+overlap: step %.2f ms against its bound %.2f ms (forward + max(backward "
              "%.2f, CPU update with transfers %.2f)): %.3fx" % (
                  1e3 * over["total"], 1e3 * bound, 1e3 * on["backward"], 1e3 * off["step"],
                  over["total"] / bound))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "args": vars(args), "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
