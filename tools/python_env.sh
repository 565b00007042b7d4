#!/usr/bin/env bash
# Makes the project virtual environment .venv (from Debian's /usr/bin/python3:
# Debian 12 forbids system-wide pip) with what the Python front end and its
# tests use from PyPI (torch 2.x, torchvision, transformers, accelerate (which
# transformers' Trainer runs on), pytest), builds the memwall
# extension with Bazel and puts the package in the environment (a .pth
# file pointing at python/, so edits to the glue take effect at once).
# Idempotent: installs only what is missing. Prints the interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
. tools/bazel_config.sh
venv=$root/.venv
if [ ! -x "$venv/bin/python" ]; then
  echo "memwall: creating $venv" >&2
  /usr/bin/python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import torch, torchvision, transformers, accelerate, pytest" \
    2>/dev/null; then
  echo "memwall: installing torch, torchvision, transformers, accelerate and pytest into $venv" \
    "(pip)" >&2
  "$venv/bin/pip" install -q "torch>=2.1" torchvision transformers accelerate pytest >&2
fi
bazel build "${memwall_bazel_flags[@]}" //python:_memwall.so >&2
install -m 0755 bazel-bin/python/_memwall.so python/memwall/_memwall.so
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$root/python" > "$site/memwall.pth"
echo "$venv/bin/python"
