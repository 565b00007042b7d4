// The NVMe tier's disk throughput as a step moves its bytes: one slot of
// --bytes streamed in chunks of block_size x queue_depth x thread_count
// bytes (the chunk the sharded optimizer gives the tier) through
// --buffer_count pinned buffers (DeepSpeed's buffer_count), never a buffer
// the size of the slot, with the given DeepSpeed aio settings, in a file
// under --dir; best of --repeats each. Three figures, one line each:
//   write <MB/s>   the slot written chunk by chunk (a buffer reused once its
//                  write is done), then synced and committed;
//   read <MB/s>    read chunk by chunk, a read in flight per buffer;
//   update <MB/s>  the optimizer's pattern (offload/nvme_chunk_stream.h):
//                  each chunk read, then written back to the spare copy,
//                  reads ahead and writes behind, one sync; MB/s of the
//                  slot's bytes (each read once and written once).
// benchmarks/nvme_benchmark.sh runs it beside fio on the same file system.
//
//   bazel-bin/benchmarks/nvme_benchmark --dir DIR [--bytes 1073741824]
//     [--block_size 1048576] [--queue_depth 8] [--thread_count 1]
//     [--single_submit 0] [--overlap_events 1] [--buffer_count 4] [--repeats 3]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "offload/nvme_chunk_stream.h"
#include "offload/nvme_store.h"
#include "runtime/status.h"

int main(int argc, char** argv) {
  using memwall::NvmeStore;
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
  auto store = NvmeStore::Open(dir, absl::StrCat("memwall-nvme-bench-", ::getpid(), ".bin"), aio);
  if (!store.ok()) {
    std::fprintf(stderr, "nvme_benchmark: %s\n", store.status().ToString().c_str());
    return 1;
  }
  const int64_t chunk = aio.block_size * aio.queue_depth * aio.thread_count;
  if (count < 1 || chunk % NvmeStore::kAlignment != 0 || bytes % chunk != 0) {
    std::fprintf(stderr,
                 "nvme_benchmark: expected --buffer_count >= 1 and --bytes a multiple of the "
                 "chunk (block_size x queue_depth x thread_count = %lld, a multiple of %lld)\n",
                 static_cast<long long>(chunk), static_cast<long long>(NvmeStore::kAlignment));
    return 2;
  }
  NvmeStore& nvme = **store;
  const int slot = nvme.AddSlot(bytes).value();
  const int64_t chunks = bytes / chunk;
  char* buffer = static_cast<char*>(std::aligned_alloc(NvmeStore::kAlignment, count * chunk));
  for (int64_t i = 0; i < count * chunk; i += 4096) buffer[i] = static_cast<char>(i / 4096);
  const auto at = [&](int64_t c) { return buffer + (c % count) * chunk; };
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
  // A transfer per buffer in flight; a buffer waits for its last one.
  const auto stream = [&](bool write) -> absl::Status {
    std::vector<NvmeStore::Pending> pending(count);
    absl::Status status = absl::OkStatus();
    for (int64_t c = 0; c < chunks && status.ok(); ++c) {
      status = nvme.Wait(pending[c % count]);
      if (!status.ok()) break;
      pending[c % count] = write ? nvme.WritePart(slot, c * chunk, chunk, at(c))
                                 : nvme.ReadPart(slot, c * chunk, chunk, at(c));
    }
    for (NvmeStore::Pending& p : pending) {
      const absl::Status s = nvme.Wait(p);
      if (status.ok()) status = s;
    }
    MW_RETURN_IF_ERROR(status);
    if (!write) return absl::OkStatus();
    MW_RETURN_IF_ERROR(nvme.FinishWrite(slot));
    return nvme.Commit(slot);
  };
  const double write = time([&] { return stream(true); });
  const double read = time([&] { return stream(false); });
  const double update = time([&]() -> absl::Status {
    memwall::NvmeChunkStream pipeline(nvme, buffer, count, chunk);
    for (int64_t c = 0; c < chunks; ++c) pipeline.Add(slot, c * chunk, chunk);
    for (int64_t c = 0; c < chunks; ++c) {
      MW_RETURN_IF_ERROR(pipeline.Next().status());
      pipeline.Write();
    }
    MW_RETURN_IF_ERROR(pipeline.Finish());
    return nvme.Commit(slot);
  });
  std::printf("write %.0f\nread %.0f\nupdate %.0f\n", bytes / write / 1e6, bytes / read / 1e6,
              bytes / update / 1e6);
  std::printf(
      "(O_DIRECT %s; chunks of %lld bytes through %d buffers; block %lld, queue depth %d, "
      "threads %d)\n",
      nvme.direct() ? "yes" : "no", static_cast<long long>(chunk), count,
      static_cast<long long>(aio.block_size), aio.queue_depth, aio.thread_count);
  std::free(buffer);
  return 0;
}
