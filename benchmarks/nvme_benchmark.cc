// The NVMe tier's disk throughput: one slot of --bytes written (with the
// tier's fdatasync, as a step's write) and read back through the tier's
// asynchronous engine (offload/aio_engine.h) with the given DeepSpeed aio
// settings, best of --repeats, in a file under --dir. Prints one line per
// direction, "write <MB/s>" and "read <MB/s>"; benchmarks/nvme_benchmark.sh
// runs it beside fio on the same file system.
//
//   bazel-bin/benchmarks/nvme_benchmark --dir DIR [--bytes 1073741824]
//     [--block_size 1048576] [--queue_depth 8] [--thread_count 1]
//     [--single_submit 0] [--overlap_events 1] [--repeats 3]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "offload/nvme_store.h"

int main(int argc, char** argv) {
  using memwall::NvmeStore;
  std::string dir = "/tmp";
  int64_t bytes = int64_t{1} << 30;
  int repeats = 3;
  memwall::AioConfig aio;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--dir")
      dir = value;
    else if (flag == "--bytes")
      bytes = std::atoll(value);
    else if (flag == "--repeats")
      repeats = std::atoi(value);
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
  auto store = NvmeStore::Open(dir, absl::StrCat("memwall-nvme-bench-", ::getpid(), ".bin"), aio);
  if (!store.ok()) {
    std::fprintf(stderr, "nvme_benchmark: %s\n", store.status().ToString().c_str());
    return 1;
  }
  const int slot = (*store)->AddSlot(bytes).value();
  char* buffer = static_cast<char*>(std::aligned_alloc(NvmeStore::kAlignment, bytes));
  for (int64_t i = 0; i < bytes; i += 4096) buffer[i] = static_cast<char>(i / 4096);
  const auto time = [&](auto&& fn) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      const absl::Status s = fn();
      if (!s.ok()) {
        std::fprintf(stderr, "nvme_benchmark: %s\n", s.ToString().c_str());
        std::exit(1);
      }
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const double write = time([&] {
    absl::Status s = (*store)->Write(slot, buffer);
    return s.ok() ? (*store)->Commit(slot) : s;
  });
  const double read = time([&] { return (*store)->Read(slot, buffer); });
  std::printf("write %.0f\nread %.0f\n", bytes / write / 1e6, bytes / read / 1e6);
  std::printf("(O_DIRECT %s; block %lld, queue depth %d, threads %d)\n",
              (*store)->direct() ? "yes" : "no", static_cast<long long>(aio.block_size),
              aio.queue_depth, aio.thread_count);
  std::free(buffer);
  return 0;
}
