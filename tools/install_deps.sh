#!/usr/bin/env bash
# Installs the Debian packages memwall builds with, if any is missing, and
# with --tests also those its tests use (chromium renders the HTML memory
# report). Idempotent: does nothing (and needs
# no network) when all are present. The CUDA toolkit is expected under
# /usr/local/cuda; without it, build with --config=nocuda.
set -euo pipefail
packages=(
  bazel-bootstrap bazel-platforms g++ catch2 libabsl-dev libopenmpi-dev
  openmpi-bin libopenblas-dev nlohmann-json3-dev zlib1g-dev pybind11-dev python3-dev
  python3-venv libaio-dev libdlpack-dev
)
if [ "${1:-}" = "--tests" ]; then
  packages+=(chromium)
fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "memwall: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "memwall: no CUDA toolkit under /usr/local/cuda; build with --config=nocuda" >&2
fi
