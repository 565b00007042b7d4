#!/usr/bin/env bash
# Runs on a GPU machine from the archive tools/gpu_bundle.sh packs (its
# run.sh unpacks it and calls this): every GPU test, then `memwall train` on
# cuda timed with the optimizer on the GPU and offloaded to the CPU, with
# and without the update overlapping backward. Settings from the
# environment: MODEL, STEPS, CPU_THREADS, BUCKET (reduce_bucket_size),
# DEVICE_MEMORY (default: the engine's, the GPU's free memory less 1 GiB),
# OFFLOAD_ONLY. Exit status 1 if a test failed or saw no GPU.
b=$(cd "$(dirname "$0")" && pwd)
# Open MPI's trees go where Debian's build looks for them, replacing any
# other build's there (their components must match the bundle's libraries,
# which stay in the bundle). --mpi-only skips the tests that need no MPI,
# --train-only every test.
cp -rf "$b/root/." /
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
  2>/dev/null)
export LD_LIBRARY_PATH=$b/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
mpirun=(/usr/bin/orterun --allow-run-as-root --oversubscribe)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1048576 " GiB"}' /proc/meminfo)"
rc=0
check() {  # check NAME COMMAND...: runs a test binary, keeps its summary
  local name=$1 out
  shift
  out=$(timeout 300 "$@" --durations yes 2>&1) || rc=1
  grep -q "^skipped: no GPU" <<<"$out" && rc=1
  echo "== $name"
  if grep -q "^memwall-tests" <<<"$out"; then
    echo "$out" | grep -E "^[0-9.]+ s: |FAILED|failed|error|^memwall-tests" | head -40
  else
    echo "$out" | tail -n 15
  fi
}
if [ "${1:-}" = "" ]; then
  check cuda_backend_test "$b/bin/cuda_backend_test"
  check nn_cuda_test "$b/bin/nn_cuda_test"
fi
# One GPU: one rank (NCCL refuses two ranks on one device).
if [ "${1:-}" != --train-only ]; then
  for t in nccl_test sharded_optimizer_cuda_test trainer_cuda_test; do
    check "$t (1 rank)" "${mpirun[@]}" -np 1 "$b/bin/${t}_bin"
  done
fi
# The step with the optimizer on the GPU against the offloaded step, the
# same model, batch and seed; the throughput of the last logged steps.
cfg=$(mktemp -d)
train() {  # train LABEL OFFLOAD(none|cpu) OVERLAP(true|false)
  local label=$1 offload=$2 overlap=$3 threads="" bucket=""
  [ -n "${CPU_THREADS:-}" ] && threads=", \"cpu_threads\": $CPU_THREADS"
  # Overlap needs several groups (the default bucket, 5e8, makes GPT-2 one).
  [ -n "${BUCKET:-}" ] && bucket=" \"reduce_bucket_size\": $BUCKET,"
  cat > "$cfg/$label.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2,$bucket
   "offload_optimizer": {"device": "$offload", "overlap_step": $overlap$threads}}}
JSON
  [ "$offload" = none ] && sed -i 's/, "overlap_step": [a-z]*\(, "cpu_threads": [0-9]*\)\?//' "$cfg/$label.json"
  echo "== memwall train: $label"
  timeout 75 "${mpirun[@]}" -np 1 "$b/bin/memwall" train --backend cuda --model "${MODEL:-gpt2-124m}" \
    ${DEVICE_MEMORY:+--device_memory "$DEVICE_MEMORY"} --config "$cfg/$label.json" --steps "${STEPS:-8}" --log_every 2 2>&1 |
    grep -E "^memwall train|step [0-9]+/|tokens/s|error|memwall:" | tail -n 6
}
[ -z "${OFFLOAD_ONLY:-}" ] && train on-gpu none false
train offload cpu false
train offload-overlap cpu true
exit $rc
