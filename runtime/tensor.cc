#include "runtime/tensor.h"

#include <limits>
#include <memory>

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

absl::StatusOr<Tensor> Tensor::FromHost(Device& device, absl::Span<const float> values,
                                        std::vector<int64_t> shape, MemoryCategory category,
                                        absl::string_view owner) {
  MW_ASSIGN_OR_RETURN(Tensor tensor, Empty(device, DType::kF32, std::move(shape), category, owner));
  if (!device.holds_bytes()) return tensor;
  if (static_cast<int64_t>(values.size()) != tensor.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", owner, "': ", values.size(),
                                                   " values for shape [",
                                                   absl::StrJoin(tensor.shape(), ", "), "] (",
                                                   tensor.numel(), " elements)"));
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  MW_RETURN_IF_ERROR(device.CopyAsync(tensor.data(), values.data(), tensor.nbytes(), *stream));
  MW_RETURN_IF_ERROR(stream->Synchronize());
  return tensor;
}

absl::StatusOr<std::vector<float>> Tensor::ToHost(Stream& stream) const {
  if (dtype_ != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToHost: tensor '", owner(), "' is ", DTypeName(dtype_), "; expected f32"));
  }
  if (device_ == nullptr || !device_->holds_bytes()) return std::vector<float>();
  std::vector<float> values(numel_);
  MW_RETURN_IF_ERROR(device_->CopyAsync(values.data(), data(), nbytes(), stream));
  MW_RETURN_IF_ERROR(stream.Synchronize());
  return values;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ", "), "] ",
                      MemoryCategoryName(category()), " '", owner(), "' on ",
                      device_ ? device_->name() : "no device");
}

}  // namespace memwall
