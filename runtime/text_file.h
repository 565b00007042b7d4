// Reading the small text files users name (configs, traced model
// descriptions): bounded, so that /dev/zero or a mistaken multi-gigabyte
// file is refused instead of read into memory without end.
#ifndef MEMWALL_RUNTIME_TEXT_FILE_H_
#define MEMWALL_RUNTIME_TEXT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace memwall {

// The contents of `path`, at most `max_bytes`. Errors start with `what`
// and the path ("config file x.json: ..."): kNotFound if it does not exist
// or cannot be opened; kInvalidArgument for a directory, and for a file
// (or a device, or a pipe) with more than `max_bytes` bytes, saying the
// bound and what was `expected` ("a config").
absl::StatusOr<std::string> ReadTextFile(const std::string& what, const std::string& path,
                                         int64_t max_bytes, const std::string& expected);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_TEXT_FILE_H_
