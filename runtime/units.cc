#include "runtime/units.h"

#include <cstdlib>

#include "absl/strings/str_format.h"

namespace memwall {

std::string FormatBytes(int64_t bytes) {
  const int64_t magnitude = std::llabs(bytes);
  if (magnitude < kKiB) return absl::StrFormat("%d B", bytes);
  if (magnitude < kMiB) return absl::StrFormat("%.2f KiB", bytes / double(kKiB));
  if (magnitude < kGiB) return absl::StrFormat("%.2f MiB", bytes / double(kMiB));
  return absl::StrFormat("%.2f GiB", bytes / double(kGiB));
}

}  // namespace memwall
