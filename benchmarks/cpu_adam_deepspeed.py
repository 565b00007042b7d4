"""memwall's CPU AdamW against DeepSpeed's CPUAdam on one thread, in and out of cache.

    bazel build //benchmarks:cpu_adam_benchmark
    .venv/bin/pip install deepspeed ninja   # its cpu_adam op is built on first use
    .venv/bin/python benchmarks/cpu_adam_deepspeed.py [--rounds 3]

DeepSpeed: the op DeepSpeedCPUAdam.step calls per parameter
(ds_opt_adam.adam_update) on f32 p, g, m and v tensors of 2^14, 2^16 (in a
core's L2), 2^18 and 2^24 elements (out of it, as an offloaded group's states
are), AdamW, best of many calls, less the same call's time on 16
elements (Python's and the binding's share); from 2^18 on also on views of
one buffer laid out as memwall's staggered arrays are (the same layout on
both sides). memwall: the staggered
one-thread rows of bazel-bin/benchmarks/cpu_adam_benchmark for the same sizes
(the kernel the offloaded update runs, no Python in the way), run between
DeepSpeed's measurements, round by round, best of as many tries as
DeepSpeed's. The two do the same memory
traffic (4 reads, 3 writes); they differ in rounding: memwall computes
sqrt(v) / sqrt(bias_correction2) and m / denominator as torch's AdamW does,
correctly rounded, while DeepSpeed multiplies by 1 / sqrt(bias_correction2).
For the sizes at or past 2^18 the line adds memwall's update as an
offloaded bf16 run makes it (pinned-pool buffers, bf16 gradients read as
they are, the bf16 parameter copy written): DeepSpeed's offload hands its
CPU Adam f32 gradients.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

# DeepSpeed's update runs an OpenMP loop; one thread, as one rank's budget.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

SIZES = (14, 16, 18, 24)
# Both sides get the same number of tries per size, best kept: DeepSpeed's
# calls below (4000 up to 2^16, 400 at 2^18, 20 at 2^24) are what
# cpu_adam_benchmark makes of --repeats 20 (x200, x20, x1).
MEMWALL_REPEATS = 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "bazel-bin", "benchmarks", "cpu_adam_benchmark")


def deepspeed_op():
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder
    except ImportError:
        sys.exit("cpu_adam_deepspeed: DeepSpeed is not installed here; "
                 "install it with: .venv/bin/pip install deepspeed ninja")
    op = CPUAdamBuilder().load()
    # id 0; lr, betas, eps, weight decay as cpu_adam_benchmark's AdamW;
    # adamw_mode true; no logging.
    op.create_adam(0, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, False)
    return op


def deepspeed_seconds(op, n, calls, staggered=False):
    """Best time of one adam_update call on n elements: on four separate
    tensors (as a user's are), or with `staggered` on views of one buffer
    placed as cpu_adam_benchmark's staggered arrays are (array k at
    k * (n + 1072) elements), so both sides run on the same layout."""
    if staggered:
        stride = n + 1024 + 48
        arena = torch.zeros(4 * stride)
        p, g, m, v = (arena[k * stride:k * stride + n] for k in range(4))
        p.fill_(0.5)
        g.fill_(1e-3)
    else:
        p = torch.full((n,), 0.5)
        g = torch.full((n,), 1e-3)
        m = torch.zeros(n)
        v = torch.zeros(n)
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        op.adam_update(0, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, p, g, m, v)
        best = min(best, time.perf_counter() - start)
    return best


def memwall_rates():
    """Parameters/s of memwall's kernel per size (the staggered 1-thread
    rows), per pool size (2^18 and up: the four arrays separate pinned-pool
    allocations, as an offloaded group's are and as DeepSpeed's four
    tensors are), and per pool size of its update reading bf16 gradients."""
    out = subprocess.run(
        [BINARY, "--sizes", ",".join(str(s) for s in SIZES), "--repeats", str(MEMWALL_REPEATS)],
        check=True, capture_output=True, text=True).stdout
    rates, pool, bf16 = {}, {}, {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "staggered" and fields[2] == "1":
            rates[int(fields[0])] = float(fields[3]) * 1e6
        if len(fields) >= 4 and fields[1] == "pool" and fields[2] == "1" and \
                "bf16" not in line:
            pool[int(fields[0])] = float(fields[3]) * 1e6
        if "bf16 gradients" in line and fields[2] == "1":
            bf16[int(fields[0])] = float(line.split("read by the update")[1].split()[0]) * 1e6
    if sorted(rates) != [1 << s for s in SIZES]:
        sys.exit(f"cpu_adam_deepspeed: unexpected output of {BINARY}:\n{out}")
    return rates, pool, bf16, out.splitlines()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.access(BINARY, os.X_OK):
        sys.exit(f"cpu_adam_deepspeed: {BINARY} is missing; "
                 "run: bazel build //benchmarks:cpu_adam_benchmark")
    torch.set_num_threads(1)
    op = deepspeed_op()
    ratios = {1 << s: [] for s in SIZES}
    pool_ratios, same_layout = {}, {}
    for round_index in range(args.rounds):
        call = deepspeed_seconds(op, 16, 4000)
        ds, ds_staggered = {}, {}
        for s in SIZES:
            n = 1 << s
            calls = 4000 if s <= 16 else 400 if s <= 18 else 20
            ds[n] = n / (deepspeed_seconds(op, n, calls) - call)
            if s >= 18:
                ds_staggered[n] = n / (deepspeed_seconds(op, n, calls, staggered=True) - call)
        mw, pool, bf16, header = memwall_rates()
        print(f"round {round_index + 1} ({header.split(', ')[-1]}; DeepSpeed's call "
              f"{call * 1e6:.2f} us subtracted):")
        for n in sorted(ds):
            ratios[n].append(mw[n] / ds[n])
            line = (f"  2^{n.bit_length() - 1:<3} memwall {mw[n] / 1e6:8.1f} Mp/s   "
                    f"DeepSpeed {ds[n] / 1e6:8.1f} Mp/s   memwall/DeepSpeed {mw[n] / ds[n]:.2f}x")
            if n in ds_staggered:
                same = mw[n] / ds_staggered[n]
                same_layout.setdefault(n, []).append(same)
                line += (f"   (DeepSpeed on the staggered layout: {ds_staggered[n] / 1e6:.1f} Mp/s,"
                         f" memwall {same:.2f}x)")
            if n in pool:
                pool_ratios.setdefault(n, []).append(pool[n] / ds[n])
                line += f"   (pool arrays: {pool[n] / 1e6:.1f} Mp/s, {pool[n] / ds[n]:.2f}x)"
            if n in bf16:
                line += (f"   (memwall on bf16 gradients, with the bf16 parameter copy: "
                         f"{bf16[n] / 1e6:.1f} Mp/s, {bf16[n] / ds[n]:.2f}x)")
            print(line)
    print("median over rounds:", ", ".join(
        f"2^{n.bit_length() - 1} {statistics.median(r):.2f}x" for n, r in sorted(ratios.items())))
    print("median over rounds, both on the staggered layout:", ", ".join(
        f"2^{n.bit_length() - 1} {statistics.median(r):.2f}x"
        for n, r in sorted(same_layout.items())))
    print("median over rounds, memwall's pool arrays:", ", ".join(
        f"2^{n.bit_length() - 1} {statistics.median(r):.2f}x"
        for n, r in sorted(pool_ratios.items())))


if __name__ == "__main__":
    main()
