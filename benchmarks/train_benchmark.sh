#!/usr/bin/env bash
# Training throughput on the host backend: tokens/s of `memwall train` for
# gpt-tiny and a GPT-2 124M-shaped model (2 layers, seq 256), ZeRO stage 0
# vs stage 3, on 1 and 2 ranks. Stage 0 on the same ranks, measured in the
# same run, is the baseline of each row.
#
#   bazel build //cli:memwall && benchmarks/train_benchmark.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
memwall=bazel-bin/cli/memwall
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
config() {  # config STAGE MICRO
  cat > "$tmp/stage$1.json" <<JSON
{"train_micro_batch_size_per_gpu": $2, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": $1, "overlap_comm": true, "reduce_bucket_size": 2000000}}
JSON
  echo "$tmp/stage$1.json"
}
tokens_per_s() {  # tokens_per_s RANKS MODEL STAGE MICRO
  tools/mpirun.sh "$1" "$memwall" train --model "$2" --config "$(config "$3" "$4")" \
    --steps "$steps" --log_every "$steps" --device_memory 4GiB 2>&1 |
    sed -nE 's/^summary: .* ([0-9]+) tokens\/s.*/\1/p'
}
echo "train_benchmark: $steps steps each, host backend, f32, AdamW, overlap on; $(nproc) cores"
printf '%-34s %5s %14s %14s %8s\n' model ranks "stage 0 tok/s" "stage 3 tok/s" "3 vs 0"
for model in "gpt-tiny:8" "gpt2-124m:layers=2,seq=256:2"; do
  name=${model%:*}
  micro=${model##*:}
  for ranks in 1 2; do
    s0=$(tokens_per_s "$ranks" "$name" 0 "$micro")
    s3=$(tokens_per_s "$ranks" "$name" 3 "$micro")
    printf '%-34s %5d %14d %14d %7.2fx\n' "$name (micro-batch $micro)" "$ranks" "$s0" "$s3" \
      "$(awk -v a="$s3" -v b="$s0" 'BEGIN { print a / b }')"
  done
done
