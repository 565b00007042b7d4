// The NVMe tier's disk throughput as a step moves its bytes (MeasureAio,
// offload/aio_tune.h): one slot of --bytes streamed in chunks of
// block_size x queue_depth x thread_count bytes (the chunk the sharded
// optimizer gives the tier) through --buffer_count buffers (DeepSpeed's
// buffer_count), never a buffer the size of the slot, with the given
// DeepSpeed aio settings, in a file under --dir; best of --repeats each.
// Three figures, one line each, decimal MB/s of the slot's bytes:
// "write", "read", and "update" (the optimizer's pattern: each chunk read,
// then written back). benchmarks/nvme_benchmark.sh runs it beside fio on
// the same file system.
//
//   bazel-bin/benchmarks/nvme_benchmark --dir DIR [--bytes 1073741824]
//     [--block_size 1048576] [--queue_depth 8] [--thread_count 1]
//     [--single_submit 0] [--overlap_events 1] [--buffer_count 4] [--repeats 3]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "offload/aio_tune.h"

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  int64_t bytes = int64_t{1} << 30;
  int repeats = 3;
  int count = 4;
  memwall::AioConfig aio;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "nvme_benchmark: expected a value after %s\n", flag.c_str());
      return 2;
    }
    const char* value = argv[i + 1];
    if (flag == "--dir")
      dir = value;
    else if (flag == "--bytes")
      bytes = std::atoll(value);
    else if (flag == "--repeats")
      repeats = std::atoi(value);
    else if (flag == "--buffer_count")
      count = std::atoi(value);
    else if (flag == "--block_size")
      aio.block_size = std::atoll(value);
    else if (flag == "--queue_depth")
      aio.queue_depth = std::atoi(value);
    else if (flag == "--thread_count")
      aio.thread_count = std::atoi(value);
    else if (flag == "--single_submit")
      aio.single_submit = std::atoi(value) != 0;
    else if (flag == "--overlap_events")
      aio.overlap_events = std::atoi(value) != 0;
    else {
      std::fprintf(stderr, "nvme_benchmark: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const absl::StatusOr<memwall::AioThroughput> t =
      memwall::MeasureAio(dir, aio, count, bytes, repeats);
  if (!t.ok()) {
    std::fprintf(stderr, "nvme_benchmark: %s\n", t.status().ToString().c_str());
    return 1;
  }
  std::printf("write %.0f\nread %.0f\nupdate %.0f\n", t->write_mbps, t->read_mbps, t->update_mbps);
  std::printf(
      "(O_DIRECT %s; chunks of %lld bytes through %d buffers; block %lld, queue depth %d, "
      "threads %d)\n",
      t->direct ? "yes" : "no", static_cast<long long>(memwall::AioChunkBytes(aio)), count,
      static_cast<long long>(aio.block_size), aio.queue_depth, aio.thread_count);
  return 0;
}
