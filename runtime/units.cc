#include "runtime/units.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memwall {

std::string FormatBytes(int64_t bytes) {
  const int64_t magnitude = std::llabs(bytes);
  if (magnitude < kKiB) return absl::StrFormat("%d B", bytes);
  if (magnitude < kMiB) return absl::StrFormat("%.2f KiB", bytes / double(kKiB));
  if (magnitude < kGiB) return absl::StrFormat("%.2f MiB", bytes / double(kMiB));
  return absl::StrFormat("%.2f GiB", bytes / double(kGiB));
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text, absl::string_view field) {
  static constexpr std::pair<absl::string_view, double> kUnits[] = {
      {"KiB", 1024.0},          {"MiB", 1048576.0},
      {"GiB", 1073741824.0},    {"TiB", 1099511627776.0},
      {"KB", 1e3},              {"MB", 1e6},
      {"GB", 1e9},              {"TB", 1e12},
      {"B", 1.0},
  };
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  absl::string_view number = trimmed;
  double multiplier = 1.0;
  for (const auto& [unit, factor] : kUnits) {
    if (absl::EndsWith(trimmed, unit)) {
      number = absl::StripAsciiWhitespace(trimmed.substr(0, trimmed.size() - unit.size()));
      multiplier = factor;
      break;
    }
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !std::isfinite(value) ||
      value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected a byte size such as 256MiB, 32GiB or 32GB, got '", text, "'"));
  }
  const double bytes = std::floor(value * multiplier);
  if (bytes >= 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' is too large (at most 8 EiB)"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace memwall
