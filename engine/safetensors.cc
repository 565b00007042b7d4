#include "engine/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/checkpoint_layout.h"
#include "engine/durable_file.h"
#include "nlohmann/json.hpp"
#include "runtime/json_reader.h"
#include "runtime/status.h"

namespace memwall {

using nlohmann::json;

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Open(const std::string& path,
                                                          const std::vector<Tensor>& tensors,
                                                          const Options& options) {
  json header = json::object();
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  const int64_t size = static_cast<int64_t>(DTypeSize(options.dtype));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t bytes = size * numel;
    header[t.name] = {{"dtype", options.dtype == DType::kF32 ? "F32" : "BF16"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  if (options.align) text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return FileError(tmp, "create");
  SafetensorsWriter writer(path, fd, options.dtype);
  writer.bytes_ = 8 + static_cast<int64_t>(text.size()) + offset;
  writer.crc_ = crc32(0L, Z_NULL, 0);
  const uint64_t length = text.size();  // little-endian on every target memwall builds for
  MW_RETURN_IF_ERROR(WriteAll(fd, tmp, &length, 8, writer.crc_));
  MW_RETURN_IF_ERROR(WriteAll(fd, tmp, text.data(), text.size(), writer.crc_));
  return writer;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      dtype_(other.dtype_),
      bytes_(other.bytes_),
      crc_(other.crc_) {
  other.fd_ = -1;
  other.path_.clear();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  // A failed or abandoned write keeps no partial file.
  if (!path_.empty()) ::unlink((path_ + ".tmp").c_str());
}

absl::Status SafetensorsWriter::Append(const float* values, int64_t count) {
  if (dtype_ == DType::kF32) return WriteAll(fd_, path_ + ".tmp", values, 4 * count, crc_);
  std::vector<uint16_t> low(count);
  for (int64_t j = 0; j < count; ++j) low[j] = F32ToBf16(values[j]);
  return WriteAll(fd_, path_ + ".tmp", low.data(), 2 * count, crc_);
}

absl::Status SafetensorsWriter::Commit() {
  const std::string tmp = path_ + ".tmp";
  absl::Status done = ::fsync(fd_) == 0 ? absl::OkStatus() : FileError(tmp, "fsync");
  ::close(fd_);
  fd_ = -1;
  if (done.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) done = FileError(path_, "rename");
  if (done.ok()) path_.clear();  // renamed: nothing to remove
  return done;
}

absl::StatusOr<uLong> FileCrc(const std::string& path, int64_t expected_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": cannot open"));
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> chunk(size_t{1} << 20);
  int64_t total = 0;
  while (in) {
    in.read(chunk.data(), chunk.size());
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk.data()), static_cast<uInt>(n));
    total += n;
  }
  if (total != expected_bytes) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", total,
                                            " bytes, the manifest says ", expected_bytes,
                                            " (truncated or replaced)"));
  }
  return crc;
}

absl::StatusOr<std::map<std::string, SafetensorsEntry>> ReadSafetensorsHeader(
    const std::string& path, int64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  if (!in.read(reinterpret_cast<char*>(&length), 8) || length > uint64_t(bytes - 8)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header length ", length,
                                            " does not fit the file's ", bytes, " bytes"));
  }
  std::string text(length, '\0');
  in.read(text.data(), length);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header is not JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header is not a JSON object"));
  }
  std::map<std::string, SafetensorsEntry> out;
  const int64_t data_bytes = bytes - 8 - int64_t(length);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = absl::StrCat(path, " tensor '", it.key(), "'");
    MW_ASSIGN_OR_RETURN(JsonReader entry,
                        JsonReader::Open(it.value(), "", absl::StrCat("checkpoint ", where, ": "),
                                         "entry"));
    MW_RETURN_IF_ERROR(entry.Require({"dtype", "shape", "data_offsets"}));
    std::string dtype;
    std::vector<int64_t> shape, offsets;
    MW_RETURN_IF_ERROR(entry.String("dtype", /*non_empty=*/false, dtype));
    MW_RETURN_IF_ERROR(entry.Ints("shape", 0, INT64_MAX, shape));
    MW_RETURN_IF_ERROR(entry.Ints("data_offsets", 0, INT64_MAX, offsets));
    // A shape whose bytes would overflow 64 bits never fits the file.
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (numel > 0 && d > 0 && numel > INT64_MAX / 4 / d) {
        return absl::DataLossError(absl::StrCat("checkpoint ", where, ": shape [",
                                                absl::StrJoin(shape, ", "),
                                                "] holds more than the file's ", data_bytes,
                                                " bytes of data"));
      }
      numel *= d;
    }
    if (dtype != "F32" || offsets.size() != 2 || offsets[1] > data_bytes ||
        offsets[1] - offsets[0] != 4 * numel) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", where, ": expected F32 data of ", 4 * numel, " bytes within the file's ",
          data_bytes, ", got dtype ", dtype, " at ", it.value()["data_offsets"].dump()));
    }
    out[it.key()] = SafetensorsEntry{path, 8 + int64_t(length) + offsets[0], numel};
  }
  return out;
}

}  // namespace memwall
