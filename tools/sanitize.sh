#!/usr/bin/env bash
# Runs the test suite under the sanitizers (configs in .bazelrc):
#   tools/sanitize.sh            ASan+UBSan over every test, then TSan over
#                                the threaded parts (the host backend's
#                                asynchronous streams, the communicators
#                                and their timeouts, the sharded optimizer's
#                                overlap, offload pager and update thread,
#                                the planning progress, the profiler)
#   tools/sanitize.sh asan|tsan  one of them
#   tools/sanitize.sh ubsan      UBSan alone over every test (asan includes it)
# Not part of .ci/run: the instrumented rebuild and the slower tests take
# about 20 minutes on 2 cores, more than CI's budget allows; run it before
# landing changes to memory handling or threading.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --tests
which=${1:-all}
if [ "$which" = all ] || [ "$which" = asan ]; then
  bazel test --config=asan //...
fi
if [ "$which" = ubsan ]; then
  bazel test --config=ubsan //...
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  bazel test --config=tsan //tests/runtime:device_test //tests/runtime:allocator_test \
    //tests/runtime:stream_order_test //tests/sharding:device_optimizer_test \
    //tests/runtime:communicator_test_np1 //tests/runtime:communicator_test_np2 \
    //tests/sharding:host_optimizer_test //tests/offload:nvme_store_test \
    //tests/offload:update_worker_test //tests/engine:progress_test \
    //tests/sharding:sharded_optimizer_test_np1 //tests/sharding:sharded_optimizer_test_np2 \
    //tests/engine:trainer_test_np1 //tests/engine:fault_test_np1 //tests/profiler/...
fi
