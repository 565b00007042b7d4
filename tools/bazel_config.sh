# Sourced by the tools scripts: the Bazel flags for this machine.
# Machines without the CUDA toolkit build with --config=nocuda.
memwall_bazel_flags=()
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  memwall_bazel_flags+=(--config=nocuda)
fi
