// Kernels on any device: host runs the CPU kernels (the ISA chosen at run
// time) in the stream's order (at once on a synchronous stream, on the
// stream's thread on an asynchronous one), cuda runs the CUDA twins on the
// stream, meta does nothing (no bytes exist) but still validates arguments.
// Pointers must be memory of `device` (host memory for host) that stays
// valid until the stream has run the work; n counts elements.
#ifndef MEMWALL_KERNELS_OPS_H_
#define MEMWALL_KERNELS_OPS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/elementwise.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {
namespace kernels {

absl::Status Fill(Device& device, Stream& stream, void* dst, DType dtype,
                  size_t n, float value);
absl::Status Copy(Device& device, Stream& stream, void* dst, const void* src,
                  size_t bytes);
absl::Status Cast(Device& device, Stream& stream, const void* src, DType src_dtype,
                  void* dst, DType dst_dtype, size_t n);
absl::Status Scale(Device& device, Stream& stream, void* x, DType dtype, size_t n,
                   float alpha);
// dst += src, added in f32 and rounded once to dst_dtype.
absl::Status Accumulate(Device& device, Stream& stream, const void* src, DType src_dtype,
                        void* dst, DType dst_dtype, size_t n);
absl::Status Axpy(Device& device, Stream& stream, float alpha, const float* x,
                  float* y, size_t n);
// Waits for the stream (the result comes back to the host). 0 on meta.
// On cuda, takes a small workspace from the device allocator.
absl::StatusOr<double> SumOfSquares(Device& device, Stream& stream, const void* x,
                                    DType dtype, size_t n);
// Waits for the stream. false on meta.
absl::StatusOr<bool> HasInfOrNan(Device& device, Stream& stream, const void* x,
                                 DType dtype, size_t n);
// Adam/AdamW step; see KernelTable::adam. On host it runs on
// MEMWALL_CPU_THREADS threads (cpu/parallel.h). kInvalidArgument names the
// field of `params` that is out of range.
absl::Status AdamUpdate(Device& device, Stream& stream, const AdamParams& params,
                        float* p, const float* g, float* m, float* v, void* p_low,
                        DType low_dtype, size_t n);

// SGD step; see KernelTable::sgd. kInvalidArgument names the bad field.
absl::Status SgdUpdate(Device& device, Stream& stream, const SgdParams& params, float* p,
                       const float* g, float* momentum_buffer, void* p_low, DType low_dtype,
                       size_t n);

// Checks the ranges of Adam's hyper-parameters (lr >= 0, 0 <= beta < 1,
// eps > 0, weight_decay >= 0, step >= 1, finite grad_scale).
absl::Status ValidateAdamParams(const AdamParams& params);

}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_OPS_H_
