// Asynchronous disk I/O for the NVMe tier, through Linux native AIO
// (Debian's libaio), with DeepSpeed's "aio" settings. A transfer is split
// into block_size requests; each of thread_count threads owns an AIO
// context and keeps up to queue_depth requests in flight, submitting them
// in one io_submit call (or one at a time with single_submit) and, with
// overlap_events, refilling its queue as each request completes (without,
// it waits for the whole batch). Submit returns at once with a ticket, so a
// caller can read ahead or write behind while it computes, and Wait
// returns the transfer's first error. Buffers, offsets and sizes must suit
// O_DIRECT: multiples of NvmeStore::kAlignment.
#ifndef MEMWALL_OFFLOAD_AIO_ENGINE_H_
#define MEMWALL_OFFLOAD_AIO_ENGINE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/aio_config.h"

namespace memwall {

class AioEngine {
 public:
  // kInvalidArgument naming the "aio" key for a bad setting; kInternal if
  // the kernel refuses an AIO context (with its reason).
  static absl::StatusOr<std::unique_ptr<AioEngine>> Create(const AioConfig& config);
  // Waits for every transfer, then ends the threads.
  ~AioEngine();
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;

  // One transfer's progress; Wait() on it.
  class Transfer;
  using Ticket = std::shared_ptr<Transfer>;

  // Starts reading (or writing) `bytes` at `offset` of `fd` into (from)
  // `buffer`, which must stay valid until Wait. `path` names the file in
  // errors.
  Ticket Submit(int fd, const std::string& path, bool write, int64_t offset, void* buffer,
                int64_t bytes);
  // When a transfer was submitted and when its last block completed.
  struct Timing {
    bool write = false;
    int64_t bytes = 0;
    std::chrono::steady_clock::time_point submitted, finished;
  };
  // Blocks until the transfer has completed; its first error: the
  // system's (kResourceExhausted for a full disk, kInternal otherwise) or
  // kDataLoss for a short transfer, naming the file and the byte. Fills
  // `timing` if given.
  absl::Status Wait(const Ticket& ticket, Timing* timing = nullptr);

  const AioConfig& config() const { return config_; }

 private:
  struct Block {
    Ticket transfer;
    int fd;
    bool write;
    int64_t offset;
    char* buffer;
    int64_t bytes;
  };
  explicit AioEngine(const AioConfig& config) : config_(config) {}
  void Run(void* context);

  const AioConfig config_;
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<Block> queue_;
  bool stop_ = false;
  std::vector<void*> contexts_;  // io_context_t per thread
  std::vector<std::thread> threads_;
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_AIO_ENGINE_H_
