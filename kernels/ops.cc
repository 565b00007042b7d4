#include "kernels/ops.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "runtime/status.h"

#if MEMWALL_HAS_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace memwall {
namespace kernels {

using internal::Dispatch;
#if MEMWALL_HAS_CUDA
using internal::CudaStreamOf;
#else
using internal::NoCuda;
#endif

absl::Status ValidateSgdParams(const SgdParams& p) {
  if (!(p.lr >= 0.0f) || !std::isfinite(p.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("sgd lr: expected a finite value >= 0, got ", p.lr));
  }
  if (!(p.momentum >= 0.0f && p.momentum < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sgd momentum: expected 0 <= momentum < 1, got ", p.momentum));
  }
  if (!(p.weight_decay >= 0.0f) || !std::isfinite(p.weight_decay)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sgd weight_decay: expected a finite value >= 0, got ", p.weight_decay));
  }
  return absl::OkStatus();
}

absl::Status ValidateAdamParams(const AdamParams& p) {
  if (!(p.lr >= 0.0f) || !std::isfinite(p.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("adam lr: expected a finite value >= 0, got ", p.lr));
  }
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("adam beta1: expected 0 <= beta1 < 1, got ", p.beta1));
  }
  if (!(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("adam beta2: expected 0 <= beta2 < 1, got ", p.beta2));
  }
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("adam eps: expected a finite value > 0, got ", p.eps));
  }
  if (!(p.weight_decay >= 0.0f) || !std::isfinite(p.weight_decay)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adam weight_decay: expected a finite value >= 0, got ", p.weight_decay));
  }
  if (p.step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("adam step: expected >= 1, got ", p.step));
  }
  if (!std::isfinite(p.grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("adam grad_scale: expected a finite value, got ", p.grad_scale));
  }
  return absl::OkStatus();
}

absl::Status Fill(Device& device, Stream& stream, void* dst, DType dtype, size_t n,
                  float value) {
  return Dispatch(
      device, stream, [=] { cpu::Kernels().fill(dst, dtype, n, value); },
      [&] { return MW_CUDA_CALL(cuda::Fill(dst, dtype, n, value, CudaStreamOf(stream)), "Fill"); });
}

absl::Status Copy(Device& device, Stream& stream, void* dst, const void* src,
                  size_t bytes) {
  return device.CopyAsync(dst, src, bytes, stream);
}

absl::Status Cast(Device& device, Stream& stream, const void* src, DType src_dtype,
                  void* dst, DType dst_dtype, size_t n) {
  return Dispatch(
      device, stream, [=] { cpu::Kernels().cast(src, src_dtype, dst, dst_dtype, n); },
      [&] {
        return MW_CUDA_CALL(
            cuda::Cast(src, src_dtype, dst, dst_dtype, n, CudaStreamOf(stream)), "Cast");
      });
}

absl::Status Scale(Device& device, Stream& stream, void* x, DType dtype, size_t n,
                   float alpha) {
  return Dispatch(
      device, stream, [=] { cpu::Kernels().scale(x, dtype, n, alpha); },
      [&] { return MW_CUDA_CALL(cuda::Scale(x, dtype, n, alpha, CudaStreamOf(stream)), "Scale"); });
}

absl::Status Accumulate(Device& device, Stream& stream, const void* src, DType src_dtype,
                        void* dst, DType dst_dtype, size_t n) {
  return Dispatch(
      device, stream, [=] { cpu::Kernels().accumulate(src, src_dtype, dst, dst_dtype, n); },
      [&] {
        return MW_CUDA_CALL(
            cuda::Accumulate(src, src_dtype, dst, dst_dtype, n, CudaStreamOf(stream)),
            "Accumulate");
      });
}

absl::Status Axpy(Device& device, Stream& stream, float alpha, const float* x,
                  float* y, size_t n) {
  return Dispatch(
      device, stream, [=] { cpu::Kernels().axpy(alpha, x, y, n); },
      [&] { return MW_CUDA_CALL(cuda::Axpy(alpha, x, y, n, CudaStreamOf(stream)), "Axpy"); });
}

absl::Status QuantizeInt8(Device& device, Stream& stream, const void* x, DType dtype, size_t n,
                          size_t block, int8_t* q, float* absmax) {
  if (block == 0) return absl::InvalidArgumentError("QuantizeInt8: block: expected >= 1, got 0");
  return Dispatch(
      device, stream, [=] { cpu::Kernels().quantize_int8(x, dtype, n, block, q, absmax); },
      [&] {
        return MW_CUDA_CALL(
            cuda::QuantizeInt8(x, dtype, n, block, q, absmax, CudaStreamOf(stream)),
            "QuantizeInt8");
      });
}

absl::Status DequantizeInt8(Device& device, Stream& stream, const int8_t* q,
                            const float* absmax, size_t n, size_t block, void* out,
                            DType dtype) {
  if (block == 0) {
    return absl::InvalidArgumentError("DequantizeInt8: block: expected >= 1, got 0");
  }
  return Dispatch(
      device, stream, [=] { cpu::Kernels().dequantize_int8(q, absmax, n, block, out, dtype); },
      [&] {
        return MW_CUDA_CALL(
            cuda::DequantizeInt8(q, absmax, n, block, out, dtype, CudaStreamOf(stream)),
            "DequantizeInt8");
      });
}

absl::StatusOr<double> SumOfSquares(Device& device, Stream& stream, const void* x,
                                    DType dtype, size_t n) {
  switch (device.backend()) {
    case Backend::kHost: {
      double result = 0.0;
      MW_RETURN_IF_ERROR(stream.RunHost([&] {
        result = cpu::Kernels().sum_of_squares(x, dtype, n);
        return absl::OkStatus();
      }));
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return result;
    }
    case Backend::kMeta:  // no value, but the wait a real run makes
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return 0.0;
    case Backend::kCuda: {
#if MEMWALL_HAS_CUDA
      MW_ASSIGN_OR_RETURN(
          DeviceBuffer workspace,
          device.Allocate((cuda::kReductionBlocks + 1) * sizeof(double),
                          MemoryCategory::kWorkspace, "kernels.sum_of_squares"));
      auto* partials = static_cast<double*>(workspace.data());
      double result = 0.0;
      MW_RETURN_IF_ERROR(CudaStatus(cuda::SumOfSquares(x, dtype, n, partials,
                                                       partials + cuda::kReductionBlocks,
                                                       CudaStreamOf(stream)),
                                    "SumOfSquares"));
      MW_RETURN_IF_ERROR(device.CopyAsync(&result, partials + cuda::kReductionBlocks,
                                          sizeof result, stream));
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return result;
#else
      return NoCuda();
#endif
    }
  }
  return 0.0;
}

absl::StatusOr<bool> HasInfOrNan(Device& device, Stream& stream, const void* x,
                                 DType dtype, size_t n) {
  switch (device.backend()) {
    case Backend::kHost: {
      bool result = false;
      MW_RETURN_IF_ERROR(stream.RunHost([&] {
        result = cpu::Kernels().has_inf_or_nan(x, dtype, n);
        return absl::OkStatus();
      }));
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return result;
    }
    case Backend::kMeta:  // no value, but the wait a real run makes
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return false;
    case Backend::kCuda: {
#if MEMWALL_HAS_CUDA
      MW_ASSIGN_OR_RETURN(DeviceBuffer workspace,
                          device.Allocate(sizeof(int), MemoryCategory::kWorkspace,
                                          "kernels.has_inf_or_nan"));
      int flag = 0;
      MW_RETURN_IF_ERROR(CudaStatus(
          cuda::HasInfOrNan(x, dtype, n, static_cast<int*>(workspace.data()),
                            CudaStreamOf(stream)),
          "HasInfOrNan"));
      MW_RETURN_IF_ERROR(device.CopyAsync(&flag, workspace.data(), sizeof flag, stream));
      MW_RETURN_IF_ERROR(stream.Synchronize());
      return flag != 0;
#else
      return NoCuda();
#endif
    }
  }
  return false;
}

absl::Status AdamUpdate(Device& device, Stream& stream, const AdamParams& params, float* p,
                        const void* g, DType g_dtype, float* m, float* v, void* p_low,
                        DType low_dtype, size_t n) {
  MW_RETURN_IF_ERROR(ValidateAdamParams(params));
  const AdamConstants constants = MakeAdamConstants(params);
  return Dispatch(
      device, stream,
      [=] {
        cpu::ParallelAdam(cpu::Kernels(), constants, p, g, g_dtype, m, v, p_low, low_dtype, n,
                          cpu::CpuThreads());
      },
      [&] {
        return MW_CUDA_CALL(
            cuda::Adam(constants, p, g, g_dtype, m, v, p_low, low_dtype, n, CudaStreamOf(stream)),
            "AdamUpdate");
      });
}

absl::Status SgdUpdate(Device& device, Stream& stream, const SgdParams& params, float* p,
                       const void* g, DType g_dtype, float* momentum_buffer, void* p_low,
                       DType low_dtype, size_t n) {
  MW_RETURN_IF_ERROR(ValidateSgdParams(params));
  if ((params.momentum > 0.0f) != (momentum_buffer != nullptr) && device.holds_bytes()) {
    return absl::InvalidArgumentError(
        "sgd momentum_buffer: expected one exactly when momentum > 0");
  }
  return Dispatch(
      device, stream,
      [=] { cpu::Kernels().sgd(params, p, g, g_dtype, momentum_buffer, p_low, low_dtype, n); },
      [&] {
        return MW_CUDA_CALL(cuda::Sgd(params, p, g, g_dtype, momentum_buffer, p_low, low_dtype, n,
                                      CudaStreamOf(stream)),
                            "SgdUpdate");
      });
}

absl::StatusOr<std::unique_ptr<GradientScan>> GradientScan::Create(Device& device, Stream& stream,
                                                                   int arrays, bool squares,
                                                                   bool nonfinite) {
  if (arrays < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GradientScan: arrays must be >= 0, got ", arrays));
  }
  std::unique_ptr<GradientScan> scan(new GradientScan(device, stream, arrays, squares, nonfinite));
  if (device.backend() == Backend::kCuda) {
#if MEMWALL_HAS_CUDA
    // [arrays sums][arrays x kReductionBlocks partials][arrays int flags]
    const size_t bytes = arrays * (1 + cuda::kReductionBlocks) * sizeof(double) +
                         arrays * sizeof(int);
    MW_ASSIGN_OR_RETURN(scan->workspace_, device.Allocate(bytes, MemoryCategory::kWorkspace,
                                                          "kernels.gradient_scan"));
#else
    return NoCuda();
#endif
  }
  return scan;
}

absl::Status GradientScan::Add(const void* x, DType dtype, size_t n) {
  if (added_ >= static_cast<int>(results_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("GradientScan: room for ", results_.size(), " arrays, all added"));
  }
  const int slot = added_++;
  switch (device_.backend()) {
    case Backend::kHost: {
      Result* out = &results_[slot];
      const bool squares = squares_, nonfinite = nonfinite_;
      return stream_.RunHost([=] {
        if (nonfinite) out->nonfinite = cpu::Kernels().has_inf_or_nan(x, dtype, n);
        if (squares) out->squares = cpu::Kernels().sum_of_squares(x, dtype, n);
        return absl::OkStatus();
      });
    }
    case Backend::kMeta:
      return absl::OkStatus();
    case Backend::kCuda: {
#if MEMWALL_HAS_CUDA
      const int arrays = static_cast<int>(results_.size());
      double* sums = static_cast<double*>(workspace_.data());
      double* partials = sums + arrays + size_t{slot} * cuda::kReductionBlocks;
      int* flags = reinterpret_cast<int*>(sums + arrays * (1 + cuda::kReductionBlocks));
      if (squares_) {
        MW_RETURN_IF_ERROR(CudaStatus(
            cuda::SumOfSquares(x, dtype, n, partials, sums + slot, CudaStreamOf(stream_)),
            "SumOfSquares"));
      }
      if (nonfinite_) {
        MW_RETURN_IF_ERROR(CudaStatus(
            cuda::HasInfOrNan(x, dtype, n, flags + slot, CudaStreamOf(stream_)), "HasInfOrNan"));
      }
      return absl::OkStatus();
#else
      return NoCuda();
#endif
    }
  }
  return absl::OkStatus();
}

GradientScan::~GradientScan() {
  if (added_ > 0 && !finished_) (void)stream_.Synchronize();  // the error is already the caller's
}

absl::StatusOr<std::vector<GradientScan::Result>> GradientScan::Finish() {
  finished_ = true;
  if (device_.backend() == Backend::kCuda && added_ > 0) {
#if MEMWALL_HAS_CUDA
    const int arrays = static_cast<int>(results_.size());
    std::vector<double> sums(added_);
    std::vector<int> flags(added_);
    const double* device_sums = static_cast<const double*>(workspace_.data());
    const int* device_flags =
        reinterpret_cast<const int*>(device_sums + arrays * (1 + cuda::kReductionBlocks));
    if (squares_) {
      MW_RETURN_IF_ERROR(
          device_.CopyAsync(sums.data(), device_sums, added_ * sizeof(double), stream_));
    }
    if (nonfinite_) {
      MW_RETURN_IF_ERROR(
          device_.CopyAsync(flags.data(), device_flags, added_ * sizeof(int), stream_));
    }
    MW_RETURN_IF_ERROR(stream_.Synchronize());
    for (int i = 0; i < added_; ++i) results_[i] = Result{flags[i] != 0, sums[i]};
#else
    return NoCuda();
#endif
  } else {
    MW_RETURN_IF_ERROR(stream_.Synchronize());
  }
  results_.resize(added_);
  return results_;
}

}  // namespace kernels
}  // namespace memwall
