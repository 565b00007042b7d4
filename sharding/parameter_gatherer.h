// ParameterGatherer: stage 3's gathered parameters for ShardedOptimizer —
// all-gathering a flat group's shards into a full buffer just before its
// layer runs, prefetching the groups expected next, and dropping what a
// step did not use.
//
// A gather allocates the group's full buffer on the caller's stream (the
// caller reads it after waiting for the gather, and frees it), brings this
// rank's shard into its own place there (from device memory; paged from
// the pinned pool; or read from NVMe through a page buffer, ParamPages)
// and all-gathers in place, on the communication stream. After each
// caller's gather, the groups the scheduler expects next
// (gather_scheduler.h) are gathered ahead while their elements stay within
// stage3_prefetch_bucket_size and all gathered groups within
// stage3_max_live_parameters (gathers ahead overlap only on an
// asynchronous communication stream); a group on NVMe has only its disk
// read started ahead, the slow part, and gathers at use. A prefetched
// group costs its memory while in flight, and the step's end drops unused
// ones.
//
// With zero_quantized_weights (ZeRO++ qwZ) a gather moves each shard as
// int8 levels and one f32 scale per block (kernels/ops.h QuantizeInt8),
// about half a 16-bit gather's bytes, and every rank dequantizes every
// shard, its own included: the ranks compute with the same weights, within
// half a level of each block's absmax / 127 of the exact ones. Reads for
// checkpoints are exact.
//
// With a secondary partition (ZeRO++ hpZ), a group's first gather in a
// step keeps this rank's 1/size of the gathered buffer (its place in its
// block of ranks), and the step's later gathers of the group (backward,
// recomputation, the next micro-batches) all-gather those inside the block
// alone: the same values, across no node if the block is one. The step's
// end drops them (the update changes the parameters).
//
// Owns the gathered buffers, their events and the scheduler; borrows the
// rest (the optimizer's). Not thread-safe.
#ifndef MEMWALL_SHARDING_PARAMETER_GATHERER_H_
#define MEMWALL_SHARDING_PARAMETER_GATHERER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "sharding/flat_layout.h"
#include "sharding/gather_scheduler.h"
#include "sharding/options.h"
#include "sharding/param_pages.h"

namespace memwall {

class ParameterGatherer {
 public:
  // Where group g's shard is at rest: `data` (device memory, or pinned
  // memory when parameters are paged), or with `slot` >= 0 that slot of
  // the ParamPages' store.
  struct Shard {
    const void* data;
    int slot;
  };
  using ShardOf = std::function<Shard(int g)>;
  // Orders the communication stream after the caller's work so far (a
  // gather's buffer may reuse a block that work still reads).
  using OrderAfterCaller = std::function<absl::Status()>;

  // `pages` may be null (no parameters on NVMe); `secondary`, the block of
  // ranks of the secondary partition (zero_hpz_partition_size), null
  // without one. Everything passed must outlive the gatherer.
  ParameterGatherer(const ShardingOptions& config, const FlatLayout& layout, Device& device,
                    Communicator& comm, Communicator* secondary, Stream& caller,
                    Stream& comm_stream, ParamPages* pages, ShardOf shard_of,
                    OrderAfterCaller order_after_caller);

  // GatherParameters: gathers group g (or takes over its prefetch), starts
  // the gathers expected next, and orders the caller's stream after g's
  // (an event, not a host wait). kFailedPrecondition if the caller holds
  // it already.
  absl::Status Gather(int g);
  // ReleaseParameters: frees the caller's gathered copy of group g, in
  // stream order; a prefetch stays.
  void Release(int g);
  // The caller's gathered copy of group g (a prefetch in flight is not),
  // or null.
  const DeviceBuffer* held(int g) const;

  // For the optimizer's own reads of the parameters (checkpoints): the
  // full buffer of group g on the communication stream, exact (never
  // quantized): the copy held or being gathered when it is exact, else
  // gathered now into `scratch`, which the caller frees after reading.
  absl::StatusOr<const DeviceBuffer*> GatherForRead(int g, DeviceBuffer& scratch);
  void Drop(int g);
  // Group g's parameters were written (outside a step's update): its
  // secondary partition goes.
  void ParametersChanged(int g) { groups_[g].secondary.Reset(); }

  // The step's end: prefetches nobody used and the secondary partitions
  // are dropped, and the scheduler keeps this step's order for the next.
  void EndStep();
  // An abandoned step: every gathered copy and secondary partition is
  // dropped.
  void AbortStep();

 private:
  struct Gathered {
    DeviceBuffer buffer;
    // The gather completes at this event; `prefetched` while nobody asked
    // for it yet.
    std::unique_ptr<Event> event;
    bool prefetched = false;
    // hpZ: this rank's slice of the step's first gather (the
    // communication stream's).
    DeviceBuffer secondary;
  };
  // Allocates group g's full buffer and enqueues its gather on the
  // communication stream: from the secondary partition when `secondary`
  // and it holds the group; else from the shards, quantized (ZeRO++ qwZ)
  // when `quantize`, keeping a secondary partition when `secondary`.
  absl::StatusOr<DeviceBuffer> GatherInto(int g, bool quantize, bool secondary);
  // The caller's (or a prefetch's) gather of group g: GatherInto with the
  // config's quantization, and its event.
  absl::Status Start(int g, bool prefetch);
  // qwZ: this rank's shard of group g block-quantized, the ranks' levels
  // and scales all-gathered (packed, see the .cc), and every shard
  // dequantized into `full`.
  absl::Status QuantizedGather(const FlatGroup& flat, const void* shard, void* full);
  // After a caller's gather: starts the gathers the scheduler expects next.
  absl::Status Prefetch();

  const ShardingOptions& config_;
  const FlatLayout& layout_;
  Device& device_;
  Communicator& comm_;
  Communicator* secondary_;
  Stream& caller_;
  Stream& comm_stream_;
  ParamPages* pages_;
  ShardOf shard_of_;
  OrderAfterCaller order_after_caller_;
  std::vector<Gathered> groups_;
  GatherScheduler scheduler_;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_PARAMETER_GATHERER_H_
