#!/usr/bin/env bash
# The NVMe tier against the pinned tier in a training step: `memwall train`
# on the host backend, bf16 AdamW, stage 2, the whole optimizer offloaded to
# pinned host memory or to a file under DIR, with the update at the step
# and overlapped with backward (offload_optimizer.overlap_step). The modes
# alternate within each round, so the VM's drift between rounds hits all
# four alike; each mode's figure is the median tokens/s of its steps after
# the first (which allocates and first touches the tiers). One OpenBLAS
# thread computes, one CPU thread updates.
#
#   bazel build //cli:memwall && benchmarks/nvme_step_benchmark.sh [ROUNDS] [STEPS] [DIR]
#   (MODEL=gpt2-350m:seq=256 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
steps=${2:-4}
dir=${3:-${TMPDIR:-/tmp}}
model=${MODEL:-gpt2-350m:seq=256}
memwall=bazel-bin/cli/memwall
tmp=$(mktemp -d "$dir/nvme_step.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nvme"
# run TIER OVERLAP -> "MEDIAN LOSS": the median tokens/s of steps 2..STEPS
# and the last step's loss
run() {
  local offload='"device": "cpu"'
  [ "$1" = nvme ] && offload='"device": "nvme", "nvme_path": "'"$tmp/nvme"'"'
  cat > "$tmp/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0001}},
 "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 20000000,
   "offload_optimizer": {$offload, "overlap_step": $2}}}
JSON
  local steps_log
  steps_log=$(OPENBLAS_NUM_THREADS=1 MEMWALL_CPU_THREADS=1 "$memwall" train --model "$model" \
    --config "$tmp/c.json" --steps "$steps" --log_every 1 --device_memory 12GiB 2>&1 |
    sed -nE 's/.*step ([0-9]+)\/[0-9]+ \| loss ([0-9.]+) \| ([0-9]+) tokens\/s.*/\1 \3 \2/p')
  echo "$(awk '$1 > 1 { print $2 }' <<<"$steps_log" | sort -n |
            awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')" \
    "$(tail -n 1 <<<"$steps_log" | cut -d' ' -f3)"
}
echo "nvme_step_benchmark: $model, $rounds round(s) of $steps steps per mode, $(nproc) cores, tiers under $dir"
printf '%-6s %14s %14s %10s %14s %14s %10s  %s\n' round "pinned, step" "NVMe, step" ratio \
  "pinned, overl." "NVMe, overl." ratio "last losses"
for r in $(seq 1 "$rounds"); do
  read -r ps psl <<<"$(run pinned false)"; read -r ns nsl <<<"$(run nvme false)"
  read -r po pol <<<"$(run pinned true)"; read -r no nol <<<"$(run nvme true)"
  same=differ
  [ "$psl" = "$nsl" ] && [ "$psl" = "$pol" ] && [ "$psl" = "$nol" ] && same="all $psl"
  printf '%-6s %14s %14s %9.2fx %14s %14s %9.2fx  %s\n' "$r" "$ps" "$ns" \
    "$(awk "BEGIN { print $ps / $ns }")" "$po" "$no" "$(awk "BEGIN { print $po / $no }")" "$same"
done
echo "(tokens/s, median of steps 2..$steps; ratio = pinned / NVMe, 1.00x = the NVMe tier costs nothing)"
