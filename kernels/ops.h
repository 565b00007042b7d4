// Kernels on any device: host runs the CPU kernels (the ISA chosen at run
// time) in the stream's order (at once on a synchronous stream, on the
// stream's thread on an asynchronous one), cuda runs the CUDA twins on the
// stream, meta does nothing (no bytes exist) but still validates arguments.
// Pointers must be memory of `device` (host memory for host) that stays
// valid until the stream has run the work; n counts elements.
#ifndef MEMWALL_KERNELS_OPS_H_
#define MEMWALL_KERNELS_OPS_H_

#include <cstddef>

#include <memory>
#include <vector>

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
// Block-based int8 quantization for a compressed all-gather (ZeRO++ qwZ;
// kernels/elementwise.h QuantizeInt8): x's n elements in blocks of `block`
// to n int8 levels and ceil(n / block) f32 absmaxes, and back into out's
// dtype. kInvalidArgument for block 0.
absl::Status QuantizeInt8(Device& device, Stream& stream, const void* x, DType dtype, size_t n,
                          size_t block, int8_t* q, float* absmax);
absl::Status DequantizeInt8(Device& device, Stream& stream, const int8_t* q,
                            const float* absmax, size_t n, size_t block, void* out,
                            DType dtype);
// Waits for the stream (the result comes back to the host). 0 on meta.
// On cuda, takes a small workspace from the device allocator.
absl::StatusOr<double> SumOfSquares(Device& device, Stream& stream, const void* x,
                                    DType dtype, size_t n);
// Waits for the stream. false on meta.
absl::StatusOr<bool> HasInfOrNan(Device& device, Stream& stream, const void* x,
                                 DType dtype, size_t n);
// The inf/nan flag and the sum of squares of several arrays, read back
// with one host wait for all of them (a step checks every gradient group):
// Add() enqueues one array's scan on the stream and returns at once;
// Finish() waits once and returns each array's results in the order added,
// each as HasInfOrNan and SumOfSquares compute them (so adding them in that
// order gives those functions' totals bit for bit). On meta the values are
// false and 0, and Finish still waits where a real run waits. Not
// thread-safe; `device` and `stream` must outlive it.
class GradientScan {
 public:
  struct Result {
    bool nonfinite = false;
    double squares = 0.0;
  };
  // Room for `arrays` Add calls; `squares` and `nonfinite` say which
  // results to compute. On cuda it allocates its workspace here (category
  // workspace), so that Add never allocates.
  static absl::StatusOr<std::unique_ptr<GradientScan>> Create(Device& device, Stream& stream,
                                                             int arrays, bool squares,
                                                             bool nonfinite);
  absl::Status Add(const void* x, DType dtype, size_t n);
  absl::StatusOr<std::vector<Result>> Finish();
  // Without Finish() (an error in between), waits for the queued scans:
  // they write into this object.
  ~GradientScan();

 private:
  GradientScan(Device& device, Stream& stream, int arrays, bool squares, bool nonfinite)
      : device_(device), stream_(stream), squares_(squares), nonfinite_(nonfinite),
        results_(arrays) {}
  Device& device_;
  Stream& stream_;
  const bool squares_, nonfinite_;
  std::vector<Result> results_;  // host: written by the stream's work
  int added_ = 0;
  bool finished_ = false;
  DeviceBuffer workspace_;  // cuda: sums, partials and flags
};

// Adam/AdamW step; see KernelTable::adam (gradients `g` in `g_dtype`,
// widened as they are read). On host it runs on MEMWALL_CPU_THREADS threads
// (cpu/parallel.h). kInvalidArgument names the field of `params` that is out
// of range.
absl::Status AdamUpdate(Device& device, Stream& stream, const AdamParams& params, float* p,
                        const void* g, DType g_dtype, float* m, float* v, void* p_low,
                        DType low_dtype, size_t n);

// SGD step; see KernelTable::sgd. kInvalidArgument names the bad field.
absl::Status SgdUpdate(Device& device, Stream& stream, const SgdParams& params, float* p,
                       const void* g, DType g_dtype, float* momentum_buffer, void* p_low,
                       DType low_dtype, size_t n);

// Checks the ranges of Adam's hyper-parameters (lr >= 0, 0 <= beta < 1,
// eps > 0, weight_decay >= 0, step >= 1, finite grad_scale).
absl::Status ValidateAdamParams(const AdamParams& params);
// The same for SGD (finite lr and weight_decay >= 0, 0 <= momentum < 1).
absl::Status ValidateSgdParams(const SgdParams& params);

}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_OPS_H_
