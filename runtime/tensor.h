// A minimal tensor: a typed, shaped view that owns one device allocation.
#ifndef MEMWALL_RUNTIME_TENSOR_H_
#define MEMWALL_RUNTIME_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/memory.h"

namespace memwall {

// Move-only. Owns its bytes (a DeviceBuffer tagged with category and owner);
// freeing happens when the tensor is destroyed. Contents are uninitialised.
// REQUIRES: the device outlives the tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;

  // Allocates a tensor. Errors: kInvalidArgument for a negative dimension or
  // a byte size that overflows; kResourceExhausted (from the allocator) when
  // the device cannot hold it.
  static absl::StatusOr<Tensor> Empty(Device& device, DType dtype,
                                      std::vector<int64_t> shape,
                                      MemoryCategory category,
                                      absl::string_view owner);

  // A tensor holding a copy of `values`, one f32 per element of `shape`;
  // returns once the copy is done (on cuda, over a stream of its own). On
  // meta the values are not kept and may be empty. kInvalidArgument naming
  // the owner when the count differs from the shape's.
  static absl::StatusOr<Tensor> FromHost(Device& device, absl::Span<const float> values,
                                         std::vector<int64_t> shape, MemoryCategory category,
                                         absl::string_view owner);
  // The f32 contents copied to host memory, after the work queued so far on
  // `stream` (which must be of this tensor's device). Empty on meta.
  // kInvalidArgument for a tensor that is not f32.
  absl::StatusOr<std::vector<float>> ToHost(Stream& stream) const;

  Device* device() const { return device_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return buffer_.size(); }
  // Null on the meta backend.
  void* data() const { return buffer_.data(); }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(buffer_.data());
  }
  MemoryCategory category() const { return buffer_.category(); }
  const std::string& owner() const { return buffer_.owner(); }
  // "bf16[4, 1024] parameter 'block0.attn.qkv.weight' on host:0"
  std::string DebugString() const;

 private:
  Device* device_ = nullptr;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DeviceBuffer buffer_;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_TENSOR_H_
