#include "offload/aio_engine.h"

#include <libaio.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memwall {

class AioEngine::Transfer {
 public:
  Transfer(std::string path, bool write, int64_t bytes, int64_t blocks)
      : path_(std::move(path)), write_(write), bytes_(bytes), remaining_(blocks) {
    submitted_ = finished_ = std::chrono::steady_clock::now();
  }

  // A block ended: `result` is the kernel's (bytes moved, or -errno).
  void Complete(int64_t offset, int64_t bytes, long result) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok() && result != bytes) {
      const char* what = write_ ? "write" : "read";
      if (result < 0) {
        const int error = static_cast<int>(-result);
        const std::string message =
            absl::StrCat("NVMe store ", path_, ": ", what, " failed: ", std::strerror(error));
        status_ = error == ENOSPC || error == EDQUOT ? absl::ResourceExhaustedError(message)
                                                     : absl::InternalError(message);
      } else {
        status_ =
            absl::DataLossError(absl::StrCat("NVMe store ", path_, ": short ", what, " at byte ",
                                             offset, " (", result, " of ", bytes, " bytes)"));
      }
    }
    if (--remaining_ == 0) {
      finished_ = std::chrono::steady_clock::now();
      done_.notify_all();
    }
  }

  absl::Status Wait(Timing* timing) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return remaining_ == 0; });
    if (timing != nullptr) *timing = Timing{write_, bytes_, submitted_, finished_};
    return status_;
  }

 private:
  const std::string path_;
  const bool write_;
  const int64_t bytes_;
  std::mutex mu_;
  std::condition_variable done_;
  int64_t remaining_;
  absl::Status status_;
  std::chrono::steady_clock::time_point submitted_, finished_;
};

absl::StatusOr<std::unique_ptr<AioEngine>> AioEngine::Create(const AioConfig& config) {
  const auto bad = [](const char* key, const std::string& expected, int64_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat("aio.", key, ": expected ", expected, ", got ", got));
  };
  if (config.block_size < 4096 || config.block_size % 4096 != 0) {
    return bad("block_size", "a multiple of 4096 bytes", config.block_size);
  }
  if (config.queue_depth < 1 || config.queue_depth > 1024) {
    return bad("queue_depth", "1..1024", config.queue_depth);
  }
  if (config.thread_count < 1 || config.thread_count > 64) {
    return bad("thread_count", "1..64", config.thread_count);
  }
  std::unique_ptr<AioEngine> engine(new AioEngine(config));
  for (int t = 0; t < config.thread_count; ++t) {
    io_context_t context = nullptr;
    const int rc = io_setup(config.queue_depth, &context);
    if (rc < 0) {
      for (void* c : engine->contexts_) io_destroy(static_cast<io_context_t>(c));
      engine->contexts_.clear();
      return absl::InternalError(
          absl::StrCat("aio: cannot create an AIO context of ", config.queue_depth,
                       " requests: ", std::strerror(-rc),
                       " (see /proc/sys/fs/aio-max-nr; lower aio.queue_depth or thread_count)"));
    }
    engine->contexts_.push_back(context);
  }
  for (int t = 0; t < config.thread_count; ++t) {
    engine->threads_.emplace_back([e = engine.get(), t] { e->Run(e->contexts_[t]); });
  }
  return engine;
}

AioEngine::~AioEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (void* c : contexts_) io_destroy(static_cast<io_context_t>(c));
}

AioEngine::Ticket AioEngine::Submit(int fd, const std::string& path, bool write, int64_t offset,
                                    void* buffer, int64_t bytes) {
  const int64_t blocks = (bytes + config_.block_size - 1) / config_.block_size;
  auto transfer = std::make_shared<Transfer>(path, write, bytes, blocks);
  if (blocks == 0) return transfer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = b * config_.block_size;
      queue_.push_back(Block{transfer, fd, write, offset + at, static_cast<char*>(buffer) + at,
                             std::min(config_.block_size, bytes - at)});
    }
  }
  work_.notify_all();
  return transfer;
}

absl::Status AioEngine::Wait(const Ticket& ticket, Timing* timing) { return ticket->Wait(timing); }

void AioEngine::Run(void* handle) {
  io_context_t context = static_cast<io_context_t>(handle);
  const int depth = config_.queue_depth;
  std::vector<iocb> iocbs(depth);
  std::vector<Block> blocks(depth);  // the block each iocb carries
  std::vector<int> free_slots;
  for (int i = depth - 1; i >= 0; --i) free_slots.push_back(i);
  std::vector<io_event> events(depth);
  int in_flight = 0;
  while (true) {
    // Take blocks for the free slots (all of them unless overlap_events
    // is off and some are still in flight).
    std::vector<iocb*> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (in_flight == 0) {
        work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
      }
      const bool refill = config_.overlap_events || in_flight == 0;
      while (refill && !free_slots.empty() && !queue_.empty()) {
        const int slot = free_slots.back();
        free_slots.pop_back();
        blocks[slot] = std::move(queue_.front());
        queue_.pop_front();
        const Block& b = blocks[slot];
        if (b.write) {
          io_prep_pwrite(&iocbs[slot], b.fd, b.buffer, b.bytes, b.offset);
        } else {
          io_prep_pread(&iocbs[slot], b.fd, b.buffer, b.bytes, b.offset);
        }
        iocbs[slot].data = reinterpret_cast<void*>(static_cast<intptr_t>(slot));
        batch.push_back(&iocbs[slot]);
      }
    }
    // Submit: in one call, or one request per call.
    for (size_t done = 0; done < batch.size();) {
      const long n = config_.single_submit ? 1 : static_cast<long>(batch.size() - done);
      const int rc = io_submit(context, n, batch.data() + done);
      if (rc == -EAGAIN || rc == -EINTR) continue;
      if (rc < 0) {  // refused: these blocks end with the error
        for (size_t i = done; i < done + n; ++i) {
          const int slot = static_cast<int>(reinterpret_cast<intptr_t>(batch[i]->data));
          Block& b = blocks[slot];
          b.transfer->Complete(b.offset, b.bytes, rc);
          b.transfer.reset();
          free_slots.push_back(slot);
        }
        done += n;
        continue;
      }
      done += rc;
      in_flight += rc;
    }
    if (in_flight == 0) continue;
    // Reap: at least one (overlap_events), or the whole batch.
    const long want = config_.overlap_events ? 1 : in_flight;
    const int got = io_getevents(context, want, depth, events.data(), nullptr);
    if (got == -EINTR) continue;
    if (got < 0) {
      // The context is unusable (never seen in practice): what is in
      // flight ends with the error rather than hanging its transfers.
      for (int slot = 0; slot < depth; ++slot) {
        Block& b = blocks[slot];
        if (b.transfer == nullptr) continue;
        b.transfer->Complete(b.offset, b.bytes, got);
        b.transfer.reset();
        free_slots.push_back(slot);
      }
      in_flight = 0;
      continue;
    }
    for (int i = 0; i < got; ++i) {
      const int slot = static_cast<int>(reinterpret_cast<intptr_t>(events[i].data));
      Block& b = blocks[slot];
      b.transfer->Complete(b.offset, b.bytes, static_cast<long>(events[i].res));
      b.transfer.reset();
      free_slots.push_back(slot);
      --in_flight;
    }
  }
}

}  // namespace memwall
