// The CPU half of ZeRO-Offload: one slice of a flat group's f32 master
// weights and optimizer moments kept in a device's pinned host pool
// (category optimizer_state) and updated by the CPU kernels on
// MEMWALL_CPU_THREADS threads. The CPU kernels share the device kernels'
// element math (kernels/elementwise.h), so a slice updated here ends bit for
// bit where the device update would have.
#ifndef MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_
#define MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/elementwise.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {

class HostOptimizerSlice {
 public:
  enum class Rule : uint8_t { kAdam, kSgd };

  // `numel` elements of master weights, plus Adam's two moments or SGD's
  // momentum buffer (when `momentum`), allocated from `device`'s pinned
  // pool as "<owner>.master", ".exp_avg", ".exp_avg_sq" or ".momentum",
  // and the gradients' landing buffer ("<owner>.grad_host", category
  // gradient, in the parameter dtype); moments start at zero, master
  // weights at zero until SetMaster. Errors:
  // kFailedPrecondition without a pinned pool; kResourceExhausted (naming
  // the pool) when it is full, with nothing left allocated.
  static absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> Create(
      Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
      absl::string_view owner);

  int64_t numel() const { return numel_; }
  // The f32 master weights (pinned host memory; null on meta).
  float* master() { return static_cast<float*>(master_.data()); }

  // REQUIRES: values.size() == numel() (ignored on meta).
  void SetMaster(absl::Span<const float> values);

  // Enqueues on `stream` the copy of `grads` (numel() elements of the
  // parameter dtype, device memory that stays valid until the stream has
  // run it) into the landing buffer: gradients stream to the host as soon
  // as they are final, while the caller goes on.
  absl::Status StageGradients(Stream& stream, const void* grads);
  // One step from the staged gradients: waits for `stream`, widens them,
  // updates the master weights and moments, and writes the refreshed
  // parameters in the parameter dtype to `params` (device or pinned
  // memory). `adam` or `sgd` gives the hyper-parameters, by the slice's
  // rule. kFailedPrecondition if no gradients were staged since the last
  // update. Returns once `stream` has run the copy back.
  absl::Status Update(Stream& stream, void* params, const kernels::AdamParams& adam,
                      const kernels::SgdParams& sgd);
  // Forgets staged gradients (a skipped step).
  void DropGradients() { staged_ = false; }
  bool staged() const { return staged_; }

 private:
  HostOptimizerSlice(Device& device, Rule rule, DType param_dtype, int64_t numel, std::string owner)
      : device_(device), rule_(rule), dtype_(param_dtype), numel_(numel), owner_(std::move(owner)) {}

  Device& device_;
  const Rule rule_;
  const DType dtype_;
  const int64_t numel_;
  const std::string owner_;
  DeviceBuffer master_;
  DeviceBuffer grads_;   // the landing buffer, parameter dtype
  bool staged_ = false;
  DeviceBuffer first_;   // Adam m, or SGD momentum (empty without)
  DeviceBuffer second_;  // Adam v
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_
