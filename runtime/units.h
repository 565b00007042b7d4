// Byte quantities in human-readable form, for reports and error messages.
#ifndef MEMWALL_RUNTIME_UNITS_H_
#define MEMWALL_RUNTIME_UNITS_H_

#include <cstdint>
#include <string>

namespace memwall {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// Binary units with two decimals: "512 B", "1.50 KiB", "256.00 MiB".
std::string FormatBytes(int64_t bytes);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_UNITS_H_
