#include "runtime/tensor.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace memwall {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "unknown";
}

absl::StatusOr<Tensor> Tensor::Empty(Device& device, DType dtype,
                                     std::vector<int64_t> shape,
                                     MemoryCategory category,
                                     absl::string_view owner) {
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", owner, "': shape[", i, "] is ", shape[i],
          "; dimensions must be >= 0"));
    }
    if (shape[i] != 0 &&
        numel > std::numeric_limits<int64_t>::max() /
                    static_cast<int64_t>(DTypeSize(dtype)) / shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", owner, "': shape [", absl::StrJoin(shape, ", "),
          "] overflows a 64-bit byte count"));
    }
    numel *= shape[i];
  }
  Tensor tensor;
  MW_ASSIGN_OR_RETURN(
      tensor.buffer_,
      device.Allocate(static_cast<size_t>(numel) * DTypeSize(dtype), category, owner));
  tensor.device_ = &device;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.numel_ = numel;
  return tensor;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ", "), "] ",
                      MemoryCategoryName(category()), " '", owner(), "' on ",
                      device_ ? device_->name() : "no device");
}

}  // namespace memwall
