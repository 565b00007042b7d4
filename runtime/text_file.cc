#include "runtime/text_file.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "runtime/units.h"

namespace memwall {

absl::StatusOr<std::string> ReadTextFile(const std::string& what, const std::string& path,
                                         int64_t max_bytes, const std::string& expected) {
  const std::string named = absl::StrCat(what, " ", path, ": ");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(named, "is a directory; expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(named, "cannot be opened"));
  // One byte past the bound tells a file at the bound from a larger one.
  std::string text(static_cast<size_t>(max_bytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, "larger than ", FormatBytes(max_bytes), "; expected ", expected));
  }
  return text;
}

}  // namespace memwall
