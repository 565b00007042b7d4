"""Host memory while memwall.torch.ZeroOptimizer takes a model over: the
process's resident memory (/proc/self/status VmRSS, and VmHWM, its peak),
read after the model is built, and after the optimizer is made. What the
construction leaves held is the engine's memory (on the host backend the
device memory is host memory too: the model states) less the model's own
parameter memory it replaced; the peak above that is what construction
holds only while it runs: the initial values on their way into the
engine, per parameter.

A model of Linear layers (--params in total, no biases), built directly
in --dtype (torch's default dtype set while building: no f32 copy of its
own), stage 2, one process, the host backend. Each measurement in a fresh
process, so the peak is this construction's.

Usage: .venv/bin/python benchmarks/construction_memory.py [--params 100e6]
    [--dtype bf16|f32]
"""
import argparse
import json
import subprocess
import sys

from torch_frontend import resident_mib  # (VmRSS, VmHWM) in MiB


def measure(params, dtype_name):
    import torch
    import memwall.torch as mt
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    width = 4096
    layers = max(1, int(params) // (width * width))
    torch.set_default_dtype(dtype)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                  for _ in range(layers)])
    torch.set_default_dtype(torch.float32)
    numel = sum(p.numel() for p in model.parameters())
    rss_before, _ = resident_mib()
    config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": dtype_name == "bf16"}}
    opt = mt.ZeroOptimizer(model, None, config, device_memory="64GiB")
    rss_after, peak = resident_mib()
    return {"numel": numel, "dtype": dtype_name,
            "held": (rss_after - rss_before) * 2**20, "peak": (peak - rss_before) * 2**20,
            "engine_requested": opt.engine.requested_peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.params, args.dtype)))
        return
    done = subprocess.run([sys.executable, __file__, "--child", "--params", str(args.params),
                           "--dtype", args.dtype], capture_output=True, text=True, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    n = r["numel"]
    print("construction_memory: %.1fM parameters in %s, stage 2, host backend" % (n / 1e6,
                                                                                  r["dtype"]))
    print("  held after construction %6.2f bytes/parameter (engine allocator %.2f)" % (
        r["held"] / n, r["engine_requested"] / n))
    print("  peak during construction %6.2f bytes/parameter above the model" % (r["peak"] / n))
    print("  transient (peak - held)  %6.2f bytes/parameter" % ((r["peak"] - r["held"]) / n))


if __name__ == "__main__":
    main()
