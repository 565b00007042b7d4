// The NVMe tier: optimizer state in a file on a fast local disk, one slot
// per owner. Every slot holds its bytes twice; Write fills the copy not in
// use and Commit switches to it, so a failed or short write (a full disk,
// an I/O error) leaves the last committed state readable and nothing half
// updated. Reads and writes go through the asynchronous engine of
// offload/aio_engine.h (DeepSpeed's "aio" settings: block size, queue
// depth, threads), with O_DIRECT where the filesystem supports it (buffers
// and sizes aligned to kAlignment) and buffered otherwise (tmpfs). The
// file is removed on close. Not thread-safe.
#ifndef MEMWALL_OFFLOAD_NVME_STORE_H_
#define MEMWALL_OFFLOAD_NVME_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/aio_config.h"
#include "offload/aio_engine.h"

namespace memwall {

class NvmeStore {
 public:
  static constexpr int64_t kAlignment = 4096;
  // `bytes` rounded up to whole kAlignment blocks: what O_DIRECT moves.
  static constexpr int64_t RoundUp(int64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  // `p` rounded up to kAlignment (null stays null: meta's buffers), for
  // buffers allocated kAlignment bytes larger than they need.
  static char* AlignUp(void* p) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<char*>((at + kAlignment - 1) / kAlignment * kAlignment);
  }

  // Creates `directory`/`file_name` and removes its name at once: the file
  // lives on this store's descriptor only, so it goes when the store does
  // or the process ends in any way (Ctrl-C, kill -9), never left behind.
  // Errors name the path: kNotFound for a missing directory,
  // kPermissionDenied, kAlreadyExists (the name is in use right now), or
  // kInternal with the system's reason.
  // Bad `aio` settings: kInvalidArgument naming the key.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Open(const std::string& directory,
                                                         const std::string& file_name,
                                                         const AioConfig& aio = AioConfig());
  // A store that only counts (for meta dry runs): slots, sizes, no file.
  static std::unique_ptr<NvmeStore> Virtual(std::string path) {
    return std::unique_ptr<NvmeStore>(new NvmeStore(std::move(path), -1, false, nullptr));
  }
  ~NvmeStore();

  const std::string& path() const { return path_; }
  // Bytes of disk the slots take (both copies).
  int64_t size() const { return size_; }
  // Bytes the transfers started so far read and wrote (a virtual store
  // counts what a real one would move).
  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }
  // Syncs of the file so far (FinishWrite, FinishWrites; a virtual store
  // counts the ones a real one would make).
  int64_t syncs() const { return syncs_; }
  // Whether the file is open with O_DIRECT.
  bool direct() const { return direct_; }

  // Adds a slot of `bytes` (two copies, each rounded up to kAlignment) and
  // reserves its disk space now, so a full disk fails here
  // (kResourceExhausted naming the file) rather than mid-training.
  absl::StatusOr<int> AddSlot(int64_t bytes);
  // A slot of one copy, rewritten in place (WritePart, Write), for data
  // that needs no last committed version (a step's gradients): Commit
  // changes nothing, and a failed write leaves it partly written.
  absl::StatusOr<int> AddScratchSlot(int64_t bytes);
  int64_t slot_bytes(int slot) const { return slots_[slot].bytes; }
  int64_t rounded_bytes(int slot) const { return slots_[slot].rounded; }

  // A part-transfer under way (ReadPart, WritePart): Wait for it before
  // touching its buffer.
  struct Pending {
    AioEngine::Ticket ticket;  // null: nothing in flight
    absl::Status failed;       // set: failed before it started
  };
  // Starts reading bytes [offset, offset + bytes) of the committed copy of
  // `slot` into `dst`. The buffer is kAlignment-aligned; offset and bytes
  // are multiples of kAlignment within the slot's rounded size.
  Pending ReadPart(int slot, int64_t offset, int64_t bytes, void* dst);
  // Starts writing `src` over the same bytes of the copy not in use. The
  // copy is whole once every part of it has been written and waited for,
  // and FinishWrite has synced it.
  Pending WritePart(int slot, int64_t offset, int64_t bytes, const void* src);
  // The transfer's error, as Write's (below); OK for an empty Pending.
  absl::Status Wait(Pending& pending);
  // Syncs what was written of `slot`'s spare copy and makes it the one
  // Commit makes current.
  absl::Status FinishWrite(int slot) { return FinishWrites({slot}); }
  // The same for several slots, with one sync of the file for all.
  absl::Status FinishWrites(absl::Span<const int> slots);

  // Reads the committed copy of `slot` into `dst` (kAlignment-aligned, at
  // least the slot's rounded size).
  absl::Status Read(int slot, void* dst);
  // Writes `src` (aligned likewise) to the copy of `slot` not in use.
  // Errors (kResourceExhausted for a full disk, kDataLoss for a short
  // write, kInternal otherwise) name the file and leave the committed copy
  // as it was.
  absl::Status Write(int slot, const void* src);
  // The same without the sync: the copy is whole once FinishWrite(s) has
  // synced it (several slots written in a step, synced once).
  absl::Status WriteUnsynced(int slot, const void* src);
  // Makes the last successful Write (or FinishWrite) of `slot` the
  // committed copy. kFailedPrecondition if there is none.
  absl::Status Commit(int slot);

  // Called by Wait with each finished transfer's timing (profiling:
  // "nvme read" and "nvme write" tracks); empty to stop.
  using Observer = std::function<void(const AioEngine::Timing&)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }
  // Testing: every write fails with EIO once this many more bytes have been
  // written (the first part of a write may land), as a failing disk would.
  void InjectWriteFailureAfter(int64_t bytes) { fail_after_ = bytes; }

 private:
  struct Slot {
    int64_t bytes = 0;      // requested
    int64_t rounded = 0;    // per copy
    int64_t offset = 0;     // of copy 0; copy 1 follows
    int committed = 0;      // which copy holds the state
    bool pending = false;   // the other copy holds a newer, uncommitted write
    int copies = 2;         // 1: a scratch slot
  };
  absl::StatusOr<int> Add(int64_t bytes, int copies);
  NvmeStore(std::string path, int fd, bool direct, std::unique_ptr<AioEngine> aio)
      : path_(std::move(path)), fd_(fd), direct_(direct), aio_(std::move(aio)) {}

  const std::string path_;
  const int fd_;
  const bool direct_;
  const std::unique_ptr<AioEngine> aio_;
  int64_t size_ = 0;
  int64_t fail_after_ = -1;
  int64_t bytes_read_ = 0, bytes_written_ = 0;
  int64_t syncs_ = 0;
  Observer observer_;
  std::vector<Slot> slots_;
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_NVME_STORE_H_
