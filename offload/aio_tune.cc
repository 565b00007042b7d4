#include "offload/aio_tune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "offload/nvme_chunk_stream.h"
#include "offload/nvme_store.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<AioThroughput> MeasureAio(const std::string& directory, const AioConfig& aio,
                                         int buffer_count, int64_t bytes, int repeats) {
  const int64_t chunk = AioChunkBytes(aio);
  if (buffer_count < 1 || repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(buffer_count < 1 ? "buffer_count" : "repeats",
                                                   ": expected at least 1, got ",
                                                   buffer_count < 1 ? buffer_count : repeats));
  }
  if (chunk <= 0 || chunk % NvmeStore::kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aio: expected block_size x queue_depth x thread_count a positive multiple of ",
        NvmeStore::kAlignment, " bytes, got ", chunk));
  }
  if (bytes <= 0 || bytes % chunk != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: expected a positive multiple of the chunk (block_size x queue_depth x "
                     "thread_count = ",
                     chunk, " bytes), got ", bytes));
  }
  MW_ASSIGN_OR_RETURN(
      std::unique_ptr<NvmeStore> store,
      NvmeStore::Open(directory, absl::StrCat("memwall-aio-", ::getpid(), ".bin"), aio));
  NvmeStore& nvme = *store;
  MW_ASSIGN_OR_RETURN(const int slot, nvme.AddSlot(bytes));
  const int64_t chunks = bytes / chunk;
  const int64_t span = buffer_count * chunk;
  std::unique_ptr<char, decltype(&std::free)> memory(
      static_cast<char*>(std::aligned_alloc(NvmeStore::kAlignment, span)), &std::free);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("aio: cannot allocate ", buffer_count, " buffers of ", chunk, " bytes"));
  }
  char* const buffers = memory.get();
  for (int64_t i = 0; i < span; i += 4096) buffers[i] = static_cast<char>(i / 4096);
  const auto at = [&](int64_t c) { return buffers + (c % buffer_count) * chunk; };
  // Best MB/s of `repeats` runs of `pass`.
  const auto best = [&](auto&& pass) -> absl::StatusOr<double> {
    double seconds = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      MW_RETURN_IF_ERROR(pass());
      seconds = std::min(
          seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return bytes / seconds / 1e6;
  };
  // A transfer per buffer in flight; a buffer waits for its last one.
  const auto one_way = [&](bool write) -> absl::Status {
    std::vector<NvmeStore::Pending> pending(buffer_count);
    absl::Status status = absl::OkStatus();
    for (int64_t c = 0; c < chunks && status.ok(); ++c) {
      status = nvme.Wait(pending[c % buffer_count]);
      if (!status.ok()) break;
      pending[c % buffer_count] = write ? nvme.WritePart(slot, c * chunk, chunk, at(c))
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
  AioThroughput out;
  out.direct = nvme.direct();
  MW_ASSIGN_OR_RETURN(out.write_mbps, best([&] { return one_way(true); }));
  MW_ASSIGN_OR_RETURN(out.read_mbps, best([&] { return one_way(false); }));
  MW_ASSIGN_OR_RETURN(out.update_mbps, best([&]() -> absl::Status {
                        NvmeChunkStream stream(nvme, buffers, buffer_count, chunk);
                        for (int64_t c = 0; c < chunks; ++c) stream.Add(slot, c * chunk, chunk);
                        for (int64_t c = 0; c < chunks; ++c) {
                          MW_RETURN_IF_ERROR(stream.Next().status());
                          stream.Write();
                        }
                        MW_RETURN_IF_ERROR(stream.Finish());
                        return nvme.Commit(slot);
                      }));
  return out;
}

std::vector<AioConfig> AioSweep(int64_t bytes, int buffer_count) {
  std::vector<AioConfig> sweep;
  for (int64_t block :
       {int64_t{128} << 10, int64_t{512} << 10, int64_t{1} << 20, int64_t{4} << 20}) {
    for (int depth : {1, 4, 8, 32}) {
      for (int threads : {1, 2}) {
        AioConfig aio;
        aio.block_size = block;
        aio.queue_depth = depth;
        aio.thread_count = threads;
        const int64_t chunk = AioChunkBytes(aio);
        if (bytes % chunk == 0 && chunk * buffer_count <= bytes) sweep.push_back(aio);
      }
    }
  }
  std::stable_sort(sweep.begin(), sweep.end(), [](const AioConfig& a, const AioConfig& b) {
    return AioChunkBytes(a) < AioChunkBytes(b);
  });
  return sweep;
}

}  // namespace memwall
