// OverlappedUpdate: the offloaded groups' CPU updates run during backward
// (offload_overlap_step; ShardedOptimizer's Note [Overlapped update]).
//
// A group's host part is handed over right after its final gradients'
// copy to the host is queued: the update thread waits for that copy (an
// event on the communication stream) and updates speculatively, writing
// the new state into the slice's spare copy and the refreshed parameters
// into a pinned buffer of the group's own, while backward goes on. Every
// buffer is allocated here, on the caller's thread, as the group is
// handed over, so what a run holds does not depend on the thread's timing.
// The step then waits (Finish), and commits, updates again with the real
// settings, or drops (Drop) what was handed over.
//
// Owns the update thread, the stream its work is ordered on, the NVMe
// tier's shared chunk buffers and what each handed-over group keeps.
// Borrows the device and the slices. Not thread-safe (the caller's side).
#ifndef MEMWALL_SHARDING_OVERLAPPED_UPDATE_H_
#define MEMWALL_SHARDING_OVERLAPPED_UPDATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/nvme_chunk_stream.h"
#include "offload/nvme_store.h"
#include "offload/update_worker.h"
#include "profiler/memory_profiler.h"
#include "runtime/device.h"
#include "sharding/host_optimizer.h"
#include "sharding/state_tier.h"

namespace memwall {

class OverlappedUpdate {
 public:
  // The thread runs on `cores` (empty: unbound).
  static absl::StatusOr<std::unique_ptr<OverlappedUpdate>> Create(Device& device,
                                                                 std::vector<int> cores);
  // Waits for the thread.
  ~OverlappedUpdate();

  // Once the groups exist: how many, and the NVMe tier (null and no
  // buffers without it) whose chunks each update streams through alone.
  void SetGroups(int groups, NvmeStore* nvme, NvmeChunkStream::Buffers chunks);

  // Hands group g's host part (`host`, named `name` in the profile) to the
  // thread, to update with `segments` once the work queued on
  // `comm_stream` so far (the copy of its final gradients) has run.
  absl::Status Hand(int g, HostOptimizerSlice& host, const std::string& name,
                    std::vector<StateTier::Segment> segments, Stream& comm_stream,
                    MemoryProfiler* profiler);
  // Waits for every handed-over update: their first error, after which
  // they are all dropped (the step fails before anything changed).
  absl::Status Finish();

  // Whether group g's update was handed over this step, with which
  // segments, and where its refreshed parameters are.
  bool handed(int g) const { return groups_[g].handed; }
  const std::vector<StateTier::Segment>& segments(int g) const { return groups_[g].segments; }
  void* params(int g) const { return groups_[g].params.data(); }
  // Forgets group g's update (the slice's current state is untouched).
  void Drop(int g);

  // A stream of `host`'s chunks alone through the shared chunk buffers
  // (null without the NVMe tier), for an update run again at the step.
  std::unique_ptr<NvmeChunkStream> ChunksAlone(const HostOptimizerSlice& host);
  // Waits for the thread (the step abandoned, or the optimizer going).
  void Wait();
  // Seconds the thread has spent updating.
  double busy_seconds() const { return worker_.busy_seconds(); }

 private:
  struct Handed {
    bool handed = false;
    std::vector<StateTier::Segment> segments;
    DeviceBuffer params;
    // The copy of the group's final gradients completes here.
    std::unique_ptr<Event> staged;
  };
  OverlappedUpdate(Device& device, std::vector<int> cores, std::unique_ptr<Stream> stream)
      : device_(device), worker_(std::move(cores)), stream_(std::move(stream)) {}

  Device& device_;
  UpdateWorker worker_;
  std::unique_ptr<Stream> stream_;
  std::vector<Handed> groups_;
  NvmeStore* nvme_ = nullptr;
  NvmeChunkStream::Buffers chunks_;
  // Allocated at the first hand-over that needs them; one update streams
  // at a time.
  DeviceBuffer chunk_buffers_;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_OVERLAPPED_UPDATE_H_
