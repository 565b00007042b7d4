#include "engine/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace memwall {
namespace {

// Fault injection (InjectCheckpointWriteFailure): bytes this process may
// still write to checkpoint files before writes fail; < 0: no limit.
std::atomic<int64_t> write_budget{-1};

}  // namespace

absl::Status FileError(const std::string& path, const char* what) {
  return absl::InternalError(absl::StrCat("checkpoint ", path, ": ", what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& path, const void* data, size_t bytes, uLong& crc) {
  if (write_budget.load() >= 0) {
    if (write_budget.fetch_sub(static_cast<int64_t>(bytes)) < static_cast<int64_t>(bytes)) {
      write_budget = 0;
      errno = EIO;
      return FileError(path, "write (injected failure)");
    }
  }
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {  // crc32 takes at most 4 GiB at once
    const size_t chunk = std::min<size_t>(bytes - done, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p + done), static_cast<uInt>(chunk));
    done += chunk;
  }
  for (size_t left = bytes; left > 0;) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(path, "write");
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return FileError(path, "open for fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : FileError(path, "fsync");
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return FileError(tmp, "create");
  uLong crc = crc32(0L, Z_NULL, 0);
  absl::Status written = WriteAll(fd, tmp, text.data(), text.size(), crc);
  if (written.ok() && ::fsync(fd) != 0) written = FileError(tmp, "fsync");
  ::close(fd);
  if (written.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) written = FileError(path, "rename");
  if (!written.ok()) ::unlink(tmp.c_str());  // a full disk keeps no partial file
  return written;
}

void InjectCheckpointWriteFailure(int64_t after_bytes) { write_budget = after_bytes; }

}  // namespace memwall
