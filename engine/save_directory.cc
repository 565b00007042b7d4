#include "engine/save_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint_layout.h"
#include "engine/durable_file.h"
#include "runtime/status.h"

namespace memwall {

namespace fs = std::filesystem;

namespace {

// This rank's part of SaveDirectory::Open: the probe, and on rank 0 the
// lock and the look for another run's checkpoints. Sets *lock_fd.
absl::Status PrepareSaveDirectory(const std::string& dir, int rank, bool resuming,
                                  const SaveDirectory::Names& names, int* lock_fd) {
  const std::string what = absl::StrCat(names.save, " ", dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": not a directory"));
  }
  if (rank == 0) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": cannot create the directory: ", ec.message()));
    }
  }
  if (!fs::is_directory(dir, ec)) {
    if (rank != 0 && !fs::exists(dir, ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": rank ", rank, " does not see the directory rank 0 made there: every rank "
          "must save to one directory they all see (a shared file system, the same path)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(what, ": not a directory"));
  }
  const std::string probe =
      (fs::path(dir) / absl::StrCat(".probe-rank", rank, "-pid", ::getpid())).string();
  uLong crc = crc32(0L, Z_NULL, 0);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": rank ", rank,
                                                    " cannot create a file there: ",
                                                    std::strerror(errno)));
  }
  const char byte = 0;
  absl::Status wrote = WriteAll(fd, probe, &byte, 1, crc);
  if (wrote.ok() && ::fsync(fd) != 0) wrote = FileError(probe, "fsync");
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": rank ", rank, " cannot write there: ", wrote.message()));
  }
  if (rank != 0) return absl::OkStatus();
  const std::string lock = (fs::path(dir) / kLockFile).string();
  const int held = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  if (held < 0) return FileError(lock, "open");
  if (::flock(held, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    std::string owner(64, '\0');
    const ssize_t n = ::pread(held, owner.data(), owner.size(), 0);
    owner.resize(n > 0 ? n : 0);
    ::close(held);
    if (error != EWOULDBLOCK) return FileError(lock, "flock");
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": another run saves there (it holds ", lock,
        owner.empty() ? "" : absl::StrCat(", process ", absl::StripAsciiWhitespace(owner)),
        "); save elsewhere, or stop that run"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(held, 0) != 0 || ::pwrite(held, pid.data(), pid.size(), 0) < 0) {
    ::close(held);
    return FileError(lock, "write");
  }
  *lock_fd = held;
  if (resuming) return absl::OkStatus();
  std::vector<StepDirectory> found = StepDirs(dir);
  found.erase(std::remove_if(found.begin(), found.end(), [](const StepDirectory& f) { return !f.complete; }),
              found.end());
  if (!found.empty()) {
    ::close(held);
    *lock_fd = -1;
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": holds ", found.size(), " checkpoint(s) of another run (the newest ",
        found.back().path, "); continue that run with ", names.resume, " ", dir,
        ", or save this one elsewhere"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SaveDirectory>> SaveDirectory::Open(ShardedOptimizer& opt,
                                                                  const std::string& dir,
                                                                  bool resuming_from_it,
                                                                  const Names& names) {
  Communicator& comm = opt.communicator();
  const int rank = comm.rank();
  // Rank 0 creates the directory before the others probe it.
  int lock_fd = -1;
  absl::Status mine = rank == 0 ? PrepareSaveDirectory(dir, 0, resuming_from_it, names, &lock_fd)
                                : absl::OkStatus();
  MW_ASSIGN_OR_RETURN(const std::vector<int64_t> first,
                      AllGatherInts(opt, {static_cast<int64_t>(mine.code())}));
  if (rank != 0 && first[0] == 0) {
    mine = PrepareSaveDirectory(dir, rank, resuming_from_it, names, &lock_fd);
  }
  std::unique_ptr<SaveDirectory> held(new SaveDirectory(dir, lock_fd));  // unlocks on error
  MW_ASSIGN_OR_RETURN(const std::vector<int64_t> codes,
                      AllGatherInts(opt, {static_cast<int64_t>(mine.code())}));
  MW_RETURN_IF_ERROR(mine);
  for (size_t r = 0; r < codes.size(); ++r) {
    const int64_t code = r == 0 ? first[0] : codes[r];
    if (code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(code),
                          absl::StrCat(names.save, " ", dir, ": rank ", r, " cannot use it (",
                                       absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                                       ", named in that rank's error)"));
    }
  }
  return held;
}

SaveDirectory::~SaveDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the flock
}

}  // namespace memwall
