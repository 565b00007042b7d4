#include "offload/host_optimizer.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> HostOptimizerSlice::Create(
    Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
    absl::string_view owner) {
  if (device.pinned_allocator() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "offloaded optimizer states of '", owner, "': ", device.name(),
        " has no pinned pool (DeviceOptions::pinned_capacity_bytes)"));
  }
  std::unique_ptr<HostOptimizerSlice> slice(
      new HostOptimizerSlice(device, rule, param_dtype, numel, std::string(owner)));
  const size_t bytes = numel * sizeof(float);
  auto allocate = [&](const char* suffix) {
    return device.AllocatePinned(bytes, MemoryCategory::kOptimizerState,
                                 absl::StrCat(owner, suffix));
  };
  MW_ASSIGN_OR_RETURN(slice->master_, allocate(".master"));
  MW_ASSIGN_OR_RETURN(slice->grads_,
                      device.AllocatePinned(numel * DTypeSize(param_dtype), MemoryCategory::kGradient,
                                            absl::StrCat(owner, ".grad_host")));
  if (rule == Rule::kAdam || momentum) {
    MW_ASSIGN_OR_RETURN(slice->first_, allocate(rule == Rule::kAdam ? ".exp_avg" : ".momentum"));
  }
  if (rule == Rule::kAdam) {
    MW_ASSIGN_OR_RETURN(slice->second_, allocate(".exp_avg_sq"));
  }
  // Pinned memory is the CPU's: written directly.
  for (DeviceBuffer* b : {&slice->master_, &slice->first_, &slice->second_}) {
    if (b->data() != nullptr) std::memset(b->data(), 0, bytes);
  }
  return slice;
}

void HostOptimizerSlice::SetMaster(absl::Span<const float> values) {
  if (master_.data() != nullptr) std::memcpy(master_.data(), values.data(), numel_ * sizeof(float));
}

absl::Status HostOptimizerSlice::StageGradients(Stream& stream, const void* grads) {
  MW_RETURN_IF_ERROR(device_.CopyAsync(grads_.data(), grads, numel_ * DTypeSize(dtype_), stream));
  staged_ = true;
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::Update(Stream& stream, void* params,
                                        const kernels::AdamParams& adam,
                                        const kernels::SgdParams& sgd) {
  if (!staged_) {
    return absl::FailedPreconditionError(
        absl::StrCat("offloaded optimizer states of '", owner_, "': no gradients staged"));
  }
  staged_ = false;
  const size_t size = DTypeSize(dtype_);
  const bool wide = dtype_ == DType::kF32;
  // Pinned staging: the gradients widened to f32, and the refreshed
  // parameters going back.
  DeviceBuffer grads32, low;
  if (!wide) {
    MW_ASSIGN_OR_RETURN(grads32, device_.AllocatePinned(numel_ * 4, MemoryCategory::kWorkspace,
                                                        absl::StrCat(owner_, ".grad_host_f32")));
    MW_ASSIGN_OR_RETURN(low, device_.AllocatePinned(numel_ * size, MemoryCategory::kWorkspace,
                                                    absl::StrCat(owner_, ".params_host")));
  }
  MW_RETURN_IF_ERROR(stream.Synchronize());  // the staged gradients have landed
  if (!device_.holds_bytes()) return absl::OkStatus();  // meta: accounting only
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  float* g = static_cast<float*>(grads_.data());
  if (!wide) {
    cpu.cast(grads_.data(), dtype_, grads32.data(), DType::kF32, numel_);
    g = static_cast<float*>(grads32.data());
  }
  auto* first = static_cast<float*>(first_.data());
  if (rule_ == Rule::kAdam) {
    MW_RETURN_IF_ERROR(kernels::ValidateAdamParams(adam));
    kernels::cpu::ParallelAdam(cpu, kernels::MakeAdamConstants(adam), master(), g, first,
                               static_cast<float*>(second_.data()), wide ? nullptr : low.data(),
                               dtype_, numel_, kernels::cpu::CpuThreads());
  } else {
    cpu.sgd(sgd, master(), g, first, wide ? nullptr : low.data(), dtype_, numel_);
  }
  MW_RETURN_IF_ERROR(
      device_.CopyAsync(params, wide ? master_.data() : low.data(), numel_ * size, stream));
  return stream.Synchronize();
}

}  // namespace memwall
