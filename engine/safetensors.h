// Safetensors files: the ones a checkpoint keeps (one per rank, f32) and
// the ones `memwall export` writes (f32 or bf16, with metadata). An 8-byte
// little-endian header length, the JSON header, then the tensors' bytes
// back to back, in the order they were declared.
//
// Writing is durable and atomic (engine/durable_file.h): the file goes to
// `<path>.tmp` and is renamed into place only whole and synced, so a
// crash, a full disk or a failed write leaves no file under the real name.
// Reading validates the header against the file's size, tensor by tensor.
// Errors name the file: "checkpoint <path>: ...".
#ifndef MEMWALL_ENGINE_SAFETENSORS_H_
#define MEMWALL_ENGINE_SAFETENSORS_H_

#include <zlib.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace memwall {

// A tensor of a file: where its f32 values start and how many there are.
struct SafetensorsEntry {
  std::string file;
  int64_t offset;  // absolute, in the file
  int64_t numel;
};

// Writes one file: the header of `tensors` (name and shape, in order)
// first, then their values through Append, in the same order.
class SafetensorsWriter {
 public:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  struct Options {
    // F32, or BF16 (Append rounds the f32 values it is given).
    DType dtype = DType::kF32;
    // The header's "__metadata__" (none when empty).
    std::map<std::string, std::string> metadata;
    // Pad the header with spaces so the data starts 8-byte aligned, as
    // safetensors' own writers do.
    bool align = false;
  };
  // Creates `<path>.tmp` and writes the header.
  static absl::StatusOr<SafetensorsWriter> Open(const std::string& path,
                                                const std::vector<Tensor>& tensors,
                                                const Options& options);
  static absl::StatusOr<SafetensorsWriter> Open(const std::string& path,
                                                const std::vector<Tensor>& tensors) {
    return Open(path, tensors, Options());
  }
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  // Removes the temporary file unless Commit succeeded.
  ~SafetensorsWriter();

  // The next `count` values, given in f32 (rounded to bf16 for a BF16
  // file).
  absl::Status Append(const float* values, int64_t count);
  // fsync and rename into place; on failure nothing stays.
  absl::Status Commit();

  // The file's bytes and CRC-32 (when whole: after the last Append).
  int64_t bytes() const { return bytes_; }
  uLong crc() const { return crc_; }

 private:
  SafetensorsWriter(std::string path, int fd, DType dtype)
      : path_(std::move(path)), fd_(fd), dtype_(dtype) {}
  std::string path_;
  int fd_;
  DType dtype_;
  int64_t bytes_ = 0;
  uLong crc_ = 0;
};

// The tensors of the file at `path`, of `bytes` bytes, by name: every one
// f32, within the file, of its shape's size. kDataLoss for a header that
// does not fit, is not JSON, or describes data the file does not hold;
// kInvalidArgument for an entry missing a field.
absl::StatusOr<std::map<std::string, SafetensorsEntry>> ReadSafetensorsHeader(
    const std::string& path, int64_t bytes);

// The CRC-32 of the whole file at `path`, which must have `expected_bytes`
// bytes (kDataLoss otherwise: truncated or replaced; kNotFound if it
// cannot be opened).
absl::StatusOr<uLong> FileCrc(const std::string& path, int64_t expected_bytes);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_SAFETENSORS_H_
