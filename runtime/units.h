// Byte quantities in human-readable form, for reports and error messages.
#ifndef MEMWALL_RUNTIME_UNITS_H_
#define MEMWALL_RUNTIME_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memwall {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// Binary units with two decimals: "512 B", "1.50 KiB", "256.00 MiB".
std::string FormatBytes(int64_t bytes);

// Parses a byte quantity: an integer or decimal number with an optional
// unit, binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB; B for
// bytes), case-sensitive as written here; no unit means bytes. "32GiB" is
// 34359738368, "32GB" is 32000000000. The result is rounded down to whole
// bytes. Errors (kInvalidArgument) name `field` and the text.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text, absl::string_view field);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_UNITS_H_
