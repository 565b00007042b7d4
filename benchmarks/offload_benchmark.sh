#!/usr/bin/env bash
# Optimizer offload (ZeRO-Offload) on the host backend: tokens/s and the
# device's optimizer-state bytes of `memwall train` with the optimizer
# states in the pinned pool (ratio 1 and 0.5) against the same run without
# offload, measured in the same invocation. bf16, ZeRO stage 2, AdamW.
#
#   bazel build //cli:memwall && benchmarks/offload_benchmark.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
memwall=bazel-bin/cli/memwall
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
config() {  # config MICRO OFFLOAD_JSON
  cat > "$tmp/c.json" <<JSON
{"train_micro_batch_size_per_gpu": $1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 2000000$2}}
JSON
  echo "$tmp/c.json"
}
run() {  # run RANKS MODEL MICRO OFFLOAD_JSON -> "tokens/s optimizer_state"
  local out
  out=$(tools/mpirun.sh "$1" "$memwall" train --model "$2" --config "$(config "$3" "$4")" \
        --steps "$steps" --log_every "$steps" --device_memory 4GiB 2>&1)
  echo "$(sed -nE 's/^summary: .* ([0-9]+) tokens\/s.*/\1/p' <<<"$out")" \
       "$(grep -oE 'optimizer_state [0-9.]+ [KMG]?i?B' <<<"$out" | tail -n 1 | cut -d' ' -f2-)"
}
echo "offload_benchmark: $steps steps each, host backend, bf16, ZeRO-2, AdamW; $(nproc) cores"
printf '%-28s %5s %-22s %-22s %-22s\n' model ranks "no offload" "offload ratio 1" "offload ratio 0.5"
for spec in "gpt-tiny:8" "gpt2-124m:layers=2,seq=256:2"; do
  model=${spec%:*}
  micro=${spec##*:}
  for ranks in 1 2; do
    read -r t0 m0 u0 <<<"$(run "$ranks" "$model" "$micro" "")"
    read -r t1 m1 u1 <<<"$(run "$ranks" "$model" "$micro" ', "offload_optimizer": {"device": "cpu"}')"
    read -r t2 m2 u2 <<<"$(run "$ranks" "$model" "$micro" ', "offload_optimizer": {"device": "cpu", "ratio": 0.5}')"
    printf '%-28s %5s %-22s %-22s %-22s\n' "$model" "$ranks" "$t0 tok/s, $m0 $u0" \
      "$t1 tok/s, $m1 $u1" "$t2 tok/s, $m2 $u2"
  done
done
