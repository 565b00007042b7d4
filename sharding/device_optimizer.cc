#include "sharding/device_optimizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<DeviceOptimizerSlice>> DeviceOptimizerSlice::Create(
    Device& device, Stream& stream, Rule rule, bool momentum, DType param_dtype, int64_t numel,
    absl::string_view owner, float* f32_params) {
  std::unique_ptr<DeviceOptimizerSlice> slice(
      new DeviceOptimizerSlice(device, stream, rule, momentum, param_dtype, numel));
  const size_t bytes = numel * sizeof(float);
  const std::vector<std::string> names = StateNames(rule, momentum);
  if (param_dtype != DType::kF32) {
    MW_ASSIGN_OR_RETURN(slice->own_master_,
                        device.Allocate(bytes, MemoryCategory::kOptimizerState,
                                        absl::StrCat(owner, ".", names[0])));
    slice->master_ = static_cast<float*>(slice->own_master_.data());
  } else {
    slice->master_ = f32_params;
  }
  if (slice->states_ >= 2) {
    MW_ASSIGN_OR_RETURN(slice->first_, device.Allocate(bytes, MemoryCategory::kOptimizerState,
                                                       absl::StrCat(owner, ".", names[1])));
  }
  if (slice->states_ == 3) {
    MW_ASSIGN_OR_RETURN(slice->second_, device.Allocate(bytes, MemoryCategory::kOptimizerState,
                                                        absl::StrCat(owner, ".", names[2])));
  }
  for (DeviceBuffer* moment : {&slice->first_, &slice->second_}) {
    if (moment->empty()) continue;
    MW_RETURN_IF_ERROR(kernels::Fill(device, stream, moment->data(), DType::kF32, numel, 0.0f));
  }
  return slice;
}

namespace {

// `base` + i elements, or null where nothing is held (meta).
template <typename T>
T* Offset(T* base, int64_t i, size_t size = sizeof(T)) {
  if (base == nullptr) return nullptr;
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + i * size);
}

}  // namespace

absl::Status DeviceOptimizerSlice::Update(Stream& stream, const UpdateArgs& args) {
  MW_RETURN_IF_ERROR(Validate(rule_, args.segments));
  // The kernels read the gradients in the parameter dtype, widening each
  // (no f32 copy of 16-bit ones), and 16-bit runs refresh the parameter copy
  // in the same pass.
  void* low = dtype_ != DType::kF32 ? args.params : nullptr;
  auto* first = static_cast<float*>(first_.data());
  auto* second = static_cast<float*>(second_.data());
  const size_t size = DTypeSize(dtype_);
  for (const Segment& s : args.segments) {
    void* low_at = Offset(low, s.begin, size);
    const void* g = Offset(args.grads, s.begin, size);
    if (rule_ == Rule::kAdam) {
      MW_RETURN_IF_ERROR(kernels::AdamUpdate(device_, stream, s.adam, Offset(master_, s.begin), g,
                                             dtype_, Offset(first, s.begin),
                                             Offset(second, s.begin), low_at, dtype_, s.count));
    } else {
      // A param_group without momentum keeps no buffer, as torch's SGD: its
      // part of the buffer stays zero.
      float* buffer = s.sgd.momentum > 0.0f ? Offset(first, s.begin) : nullptr;
      MW_RETURN_IF_ERROR(kernels::SgdUpdate(device_, stream, s.sgd, Offset(master_, s.begin), g,
                                            dtype_, buffer, low_at, dtype_, s.count));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<float*> DeviceOptimizerSlice::StateAt(int which, int64_t begin, int64_t count) {
  if (which < 0 || which >= states_ || begin < 0 || count < 0 || begin + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("device optimizer state ", which, " of ", states_,
                                              ", elements [", begin, ", ", begin + count,
                                              ") of ", numel_));
  }
  float* base = which == 0 ? master_
                           : static_cast<float*>((which == 1 ? first_ : second_).data());
  return base == nullptr ? nullptr : base + begin;
}

absl::Status DeviceOptimizerSlice::ReadState(int which, int64_t begin, int64_t count,
                                             float* out) {
  MW_ASSIGN_OR_RETURN(float* state, StateAt(which, begin, count));
  if (!device_.holds_bytes()) return absl::OkStatus();
  MW_RETURN_IF_ERROR(device_.CopyAsync(out, state, count * sizeof(float), stream_));
  return stream_.Synchronize();
}

absl::Status DeviceOptimizerSlice::WriteState(int which, int64_t begin, int64_t count,
                                              const float* in) {
  MW_ASSIGN_OR_RETURN(float* state, StateAt(which, begin, count));
  if (!device_.holds_bytes()) return absl::OkStatus();
  MW_RETURN_IF_ERROR(device_.CopyAsync(state, in, count * sizeof(float), stream_));
  return stream_.Synchronize();
}

}  // namespace memwall
