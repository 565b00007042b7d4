// The device tier of a rank's optimizer state (Note [State tiers] in
// sharding/state_tier.h): one slice of a flat group's update range whose
// master weights and moments live in device memory and update with the
// device kernels, on the optimizer's communication stream.
#ifndef MEMWALL_SHARDING_DEVICE_OPTIMIZER_H_
#define MEMWALL_SHARDING_DEVICE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "sharding/state_tier.h"

namespace memwall {

class DeviceOptimizerSlice final : public StateTier {
 public:
  // `numel` elements on `device`, moved and updated on `stream` (which must
  // outlive the slice): Adam's moments "<owner>.exp_avg" and ".exp_avg_sq",
  // or SGD's "<owner>.momentum" (when `momentum`), category
  // optimizer_state, zeroed on `stream`; and, in 16-bit runs, f32 master
  // weights "<owner>.master" (uninitialised: WriteState or master()). In
  // f32 runs the parameters are the master weights: `f32_params`, numel
  // elements of the caller's that outlive the slice (null on meta).
  // kResourceExhausted when the device is full, with nothing left
  // allocated.
  static absl::StatusOr<std::unique_ptr<DeviceOptimizerSlice>> Create(
      Device& device, Stream& stream, Rule rule, bool momentum, DType param_dtype, int64_t numel,
      absl::string_view owner, float* f32_params);

  int64_t numel() const override { return numel_; }
  int num_states() const override { return states_; }
  int64_t scratch_bytes() const override { return 0; }
  bool two_phase() const override { return false; }
  // Updates in place and writes the refreshed parameters (16-bit runs) in
  // the same pass: Commit has nothing left to do.
  absl::Status Update(Stream& stream, const UpdateArgs& args) override;
  absl::Status Commit(Stream&, void*) override { return absl::OkStatus(); }
  absl::Status ReadState(int which, int64_t begin, int64_t count, float* out) override;
  absl::Status WriteState(int which, int64_t begin, int64_t count, const float* in) override;

  // The f32 master weights (device memory; the parameters in f32 runs).
  float* master() const { return master_; }

 private:
  DeviceOptimizerSlice(Device& device, Stream& stream, Rule rule, bool momentum, DType dtype,
                       int64_t numel)
      : device_(device),
        stream_(stream),
        rule_(rule),
        states_(rule == Rule::kAdam ? 3 : (momentum ? 2 : 1)),
        dtype_(dtype),
        numel_(numel) {}
  // State `which`'s f32 array, after checking the range (kOutOfRange).
  absl::StatusOr<float*> StateAt(int which, int64_t begin, int64_t count);

  Device& device_;
  Stream& stream_;
  const Rule rule_;
  const int states_;
  const DType dtype_;
  const int64_t numel_;
  DeviceBuffer own_master_;  // 16-bit runs
  float* master_ = nullptr;
  DeviceBuffer first_;   // Adam m, or SGD momentum (empty without)
  DeviceBuffer second_;  // Adam v
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_DEVICE_OPTIMIZER_H_
