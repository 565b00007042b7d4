// Durable writes of checkpoint files: bytes written whole (retrying short
// writes and EINTR) with their CRC-32, made durable with fsync, and small
// files replaced atomically (a temporary name, fsync, rename), so a crash
// or a full disk at any moment leaves either the old file or the new one,
// never a partial one under the real name.
//
// Errors are kInternal: "checkpoint <path>: <what>: <the system's reason>".
#ifndef MEMWALL_ENGINE_DURABLE_FILE_H_
#define MEMWALL_ENGINE_DURABLE_FILE_H_

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace memwall {

// kInternal naming `path`, `what` failed and errno's reason.
absl::Status FileError(const std::string& path, const char* what);

// Writes `bytes` at the end of the open file `fd` (named `path` in
// errors), adding them to `crc` (zlib's crc32).
absl::Status WriteAll(int fd, const std::string& path, const void* data, size_t bytes, uLong& crc);

// fsync of a file or (`directory`) of a directory's entries.
absl::Status SyncPath(const std::string& path, bool directory);

// Replaces `path` with `text` atomically; on failure `path` is as it was
// and no temporary file stays.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// Fault injection (tests): in this process, writes through WriteAll fail
// (EIO) once `after_bytes` more bytes have been written; -1 cancels.
void InjectCheckpointWriteFailure(int64_t after_bytes);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_DURABLE_FILE_H_
