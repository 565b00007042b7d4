#include "offload/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {
namespace {

absl::Status Errno(int error, const std::string& path, const char* what) {
  const std::string message = absl::StrCat("NVMe store ", path, ": ", what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(message);
    case EEXIST: return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return absl::ResourceExhaustedError(message);
    default: return absl::InternalError(message);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const std::string& directory,
                                                           const std::string& file_name,
                                                           const AioConfig& aio) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<AioEngine> engine, AioEngine::Create(aio));
  struct stat info;
  if (::stat(directory.c_str(), &info) != 0) return Errno(errno, directory, "cannot use the directory");
  if (!S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe store ", directory, ": expected a directory (nvme_path)"));
  }
  const std::string path = absl::StrCat(directory, "/", file_name);
  const int flags = O_RDWR | O_CREAT | O_EXCL;
  bool direct = true;
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {  // the filesystem refuses O_DIRECT (tmpfs)
    direct = false;
    fd = ::open(path.c_str(), flags, 0600);
  }
  if (fd < 0) return Errno(errno, path, "cannot create the file");
  // The name goes at once; the open descriptor keeps the file until the
  // store closes it or the process ends, however it ends (Ctrl-C, a
  // timeout's kill, a crash), so no run leaves gigabytes behind.
  if (::unlink(path.c_str()) != 0) {
    const int error = errno;
    ::close(fd);
    return Errno(error, path, "cannot unlink the file (it would outlive the run)");
  }
  return std::unique_ptr<NvmeStore>(new NvmeStore(path, fd, direct, std::move(engine)));
}

NvmeStore::~NvmeStore() {
  if (fd_ >= 0) ::close(fd_);  // virtual stores have none
}

absl::StatusOr<int> NvmeStore::AddSlot(int64_t bytes) { return Add(bytes, 2); }

absl::StatusOr<int> NvmeStore::AddScratchSlot(int64_t bytes) { return Add(bytes, 1); }

absl::StatusOr<int> NvmeStore::Add(int64_t bytes, int copies) {
  Slot slot;
  slot.bytes = bytes;
  slot.rounded = RoundUp(bytes);
  slot.offset = size_;
  slot.copies = copies;
  // Reserve the blocks now: a full disk shows here, not in a later write.
  const int error = fd_ < 0 ? 0 : ::posix_fallocate(fd_, size_, copies * slot.rounded);
  if (error != 0) return Errno(error, path_, "cannot reserve space for a slot");
  size_ += copies * slot.rounded;
  slots_.push_back(slot);
  return static_cast<int>(slots_.size()) - 1;
}

NvmeStore::Pending NvmeStore::ReadPart(int slot, int64_t offset, int64_t bytes, void* dst) {
  const Slot& s = slots_[slot];
  bytes_read_ += bytes;
  if (fd_ < 0) return Pending{};  // virtual: nothing moves
  return Pending{
      aio_->Submit(fd_, path_, false, s.offset + s.committed * s.rounded + offset, dst, bytes),
      absl::OkStatus()};
}

NvmeStore::Pending NvmeStore::WritePart(int slot, int64_t offset, int64_t bytes, const void* src) {
  Slot& s = slots_[slot];
  s.pending = false;  // the spare copy is being rewritten
  bytes_written_ += bytes;
  if (fd_ < 0) return Pending{};
  const int64_t at = s.offset + (s.copies == 2 ? 1 - s.committed : 0) * s.rounded + offset;
  void* buffer = const_cast<void*>(src);
  if (fail_after_ >= 0 && fail_after_ < bytes) {
    // Injected failure: the first part lands (whole aligned blocks), then
    // the disk fails.
    const int64_t lands = fail_after_ / kAlignment * kAlignment;
    fail_after_ = 0;
    absl::Status landed = absl::OkStatus();
    if (lands > 0) landed = aio_->Wait(aio_->Submit(fd_, path_, true, at, buffer, lands));
    return Pending{nullptr, landed.ok() ? Errno(EIO, path_, "write failed") : landed};
  }
  if (fail_after_ > 0) fail_after_ -= bytes;
  return Pending{aio_->Submit(fd_, path_, true, at, buffer, bytes), absl::OkStatus()};
}

absl::Status NvmeStore::Wait(Pending& pending) {
  absl::Status status = pending.failed;
  if (pending.ticket != nullptr) {
    AioEngine::Timing timing;
    const absl::Status transfer = aio_->Wait(pending.ticket, &timing);
    if (status.ok()) status = transfer;
    if (observer_) observer_(timing);
  }
  pending = Pending{};
  return status;
}

absl::Status NvmeStore::FinishWrites(absl::Span<const int> slots) {
  ++syncs_;
  if (fd_ >= 0 && ::fdatasync(fd_) != 0) return Errno(errno, path_, "sync failed");
  for (int slot : slots) slots_[slot].pending = true;
  return absl::OkStatus();
}

absl::Status NvmeStore::Read(int slot, void* dst) {
  Pending read = ReadPart(slot, 0, slots_[slot].rounded, dst);
  return Wait(read);
}

absl::Status NvmeStore::Write(int slot, const void* src) {
  MW_RETURN_IF_ERROR(WriteUnsynced(slot, src));
  return FinishWrite(slot);
}

absl::Status NvmeStore::WriteUnsynced(int slot, const void* src) {
  Pending write = WritePart(slot, 0, slots_[slot].rounded, src);
  return Wait(write);
}

absl::Status NvmeStore::Commit(int slot) {
  Slot& s = slots_[slot];
  if (s.copies == 1) return absl::OkStatus();
  if (!s.pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe store ", path_, ": slot ", slot, " has no written copy to commit"));
  }
  s.committed = 1 - s.committed;
  s.pending = false;
  return absl::OkStatus();
}

}  // namespace memwall
