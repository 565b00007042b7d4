// The NVMe tier's disk throughput on a given file system, measured as a
// training step moves its bytes, and the sweep of DeepSpeed "aio" settings
// that picks the fastest (what DeepSpeed's ds_nvme_tune does for its
// engine). `memwall tune-aio` and benchmarks/nvme_benchmark run it.
//
// The optimizer gives the tier chunks of block_size x queue_depth x
// thread_count bytes (sharding/options.h), streamed through buffer_count
// pinned buffers; so does the measurement, on one slot of a file it
// creates under the directory and removes.
#ifndef MEMWALL_OFFLOAD_AIO_TUNE_H_
#define MEMWALL_OFFLOAD_AIO_TUNE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/aio_config.h"

namespace memwall {

// The bytes of one chunk under `aio`.
inline int64_t AioChunkBytes(const AioConfig& aio) {
  return aio.block_size * aio.queue_depth * aio.thread_count;
}

// Decimal MB/s of the slot's bytes, best of the repeats each:
struct AioThroughput {
  // written chunk by chunk (a buffer reused once its write is done), then
  // synced and committed;
  double write_mbps = 0;
  // read chunk by chunk, one read in flight per buffer;
  double read_mbps = 0;
  // the optimizer's update pattern (offload/nvme_chunk_stream.h): each
  // chunk read, then written back to the spare copy, reads ahead and
  // writes behind, one sync; each byte read once and written once.
  double update_mbps = 0;
  bool direct = false;  // the file was opened with O_DIRECT
};

// Measures a slot of `bytes` in a new file under `directory` with `aio`
// and `buffer_count` buffers, `repeats` times each. kInvalidArgument
// naming the setting for bytes that are not a positive multiple of the
// chunk, a chunk that is not a multiple of 4096, buffer_count or repeats
// below 1, or a bad aio setting; the store's errors (naming the path) for
// the directory and the disk.
absl::StatusOr<AioThroughput> MeasureAio(const std::string& directory, const AioConfig& aio,
                                         int buffer_count, int64_t bytes, int repeats);

// The settings `memwall tune-aio` tries: block sizes 128 KiB to 4 MiB,
// queue depths 1 to 32, one and two threads, DeepSpeed's submission
// defaults; only those whose chunk divides `bytes` and whose buffers
// (buffer_count chunks) fit in it. In order of chunk size, then block size.
std::vector<AioConfig> AioSweep(int64_t bytes, int buffer_count);

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_AIO_TUNE_H_
