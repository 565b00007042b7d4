// The tiers that hold a rank's optimizer state, behind one interface.
//
// Note [State tiers]
// A rank updates one range of each flat group (its update range: the whole
// group at stage 0, its shard at stages 1-3). The optimizer state of that
// range (f32 master weights, Adam's two moments or SGD's momentum) lives
// in at most two tiers, split at host_numel (the offload ratio):
//   host    the first host_numel elements, in the device's pinned pool or,
//           with an NVMe path, in a file through pinned staging, updated by
//           the CPU (sharding/host_optimizer.h: HostOptimizerSlice);
//   device  the rest, in device memory, updated by device kernels
//           (sharding/device_optimizer.h: DeviceOptimizerSlice).
// The sharded optimizer drives every tier the same way: Update computes the
// new state from the gradients, Commit makes it current and puts the
// refreshed parameters in place, and ReadState/WriteState move committed
// state for checkpoints. A tier whose Update leaves the current state
// untouched until Commit (two_phase()) lets a step update every group
// before committing any, so a failed update (an NVMe write) changes
// nothing.
#ifndef MEMWALL_SHARDING_STATE_TIER_H_
#define MEMWALL_SHARDING_STATE_TIER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/elementwise.h"
#include "runtime/device.h"

namespace memwall {

class NvmeChunkStream;  // offload/nvme_chunk_stream.h

class StateTier {
 public:
  // Which update rule a tier applies.
  enum class Rule : uint8_t { kAdam, kSgd };

  // A run of the tier's elements updated with one set of hyperparameters
  // (the parameters of one hyperparameter group); the tier's rule picks
  // adam or sgd.
  struct Segment {
    int64_t begin = 0;  // relative to the tier's first element
    int64_t count = 0;
    kernels::AdamParams adam;
    kernels::SgdParams sgd;
  };

  struct UpdateArgs {
    // Segments in order, covering [0, numel()) exactly.
    absl::Span<const Segment> segments;
    // numel() gradients in the parameter dtype, device memory (the device
    // tier reads them; the host tier reads what StageGradients staged).
    const void* grads = nullptr;
    // Where numel() refreshed parameters (parameter dtype) go at the latest
    // by Commit; device memory, or pinned memory when parameters are paged.
    void* params = nullptr;
    // Pinned scratch of scratch_bytes(), untouched by the caller until
    // Commit (null on meta or when scratch_bytes() is 0).
    void* scratch = nullptr;
    // Host tier on NVMe, set: the stream its chunks were queued on next
    // (HostOptimizerSlice::QueueChunks), which may hold other slices' chunks
    // before and after them, and which the caller finishes before any
    // Commit; so the update allocates no buffers (an update on another
    // thread). Unset: the tier streams through buffers of its own.
    NvmeChunkStream* nvme_stream = nullptr;
    // Host tier with its gradients on NVMe: pinned memory of
    // HostOptimizerSlice::grad_buffer_bytes(), kAlignment-aligned, they
    // are read into.
    void* grad_buffer = nullptr;
  };

  // kInvalidArgument for the first segment whose hyperparameters `rule`
  // refuses; tiers check every segment before they update any.
  static absl::Status Validate(Rule rule, absl::Span<const Segment> segments);

  virtual ~StateTier() = default;

  // Elements of the update range this tier holds.
  virtual int64_t numel() const = 0;
  // The f32 arrays it keeps: master weights, then Adam's m and v (or SGD's
  // momentum buffer).
  virtual int num_states() const = 0;
  // Pinned scratch bytes an Update needs (0: none).
  virtual int64_t scratch_bytes() const = 0;
  // Whether Update leaves the current state as it was until Commit.
  virtual bool two_phase() const = 0;

  // Phase one of a step, ordered on `stream` (the optimizer's
  // communication stream). kInvalidArgument for bad settings in any
  // segment (Validate), before anything changes.
  virtual absl::Status Update(Stream& stream, const UpdateArgs& args) = 0;
  // Phase two: the update becomes current and the refreshed parameters are
  // at `params` (the UpdateArgs::params of the Update) once `stream` has
  // run what this enqueues. Host tier: null `params` when the caller took
  // them from the scratch already (parameters on NVMe).
  virtual absl::Status Commit(Stream& stream, void* params) = 0;

  // Elements [begin, begin + count) of committed state `which` (0: master,
  // 1: first moment or momentum, 2: second moment) into host memory `out`,
  // or from `in`; complete when the call returns. Nothing happens on meta.
  // kOutOfRange for a range outside numel() or a state the tier does not
  // keep.
  virtual absl::Status ReadState(int which, int64_t begin, int64_t count, float* out) = 0;
  virtual absl::Status WriteState(int which, int64_t begin, int64_t count, const float* in) = 0;
};

// The names of a slice's f32 state arrays, in order: "master", then Adam's
// "exp_avg" and "exp_avg_sq", or SGD's "momentum" (when it has momentum).
// What the slices name their memory ("<owner>.<name>"), checkpoints their
// tensors ("<parameter>/<name>"), and memwall.torch maps to torch's names.
std::vector<std::string> StateNames(StateTier::Rule rule, bool momentum);

}  // namespace memwall

#endif  // MEMWALL_SHARDING_STATE_TIER_H_
