// ParamResidence: where each flat group's parameters live on this rank
// between uses, for ShardedOptimizer, and every write that puts values
// there.
//
// What a rank holds of a group (StageRules::held_parameters: the whole
// padded group at stages 0-2, its shard at stage 3), in param_dtype, lives
// in one of three places:
//   - device memory (the default), where the model reads it at stages 0-2
//     and the update writes it in place;
//   - the pinned host pool (stage 3, offload_param "cpu"): a gather pages
//     the shard in (ParameterGatherer), the update writes it in place;
//   - a slot of an NVMe file (offload_param "nvme", the groups past the
//     first max_in_cpu elements of shards): a gather reads the shard
//     through a page buffer (ParamPages); the update leaves the refreshed
//     shard in a scratch buffer, written to the slot's spare copy and made
//     current after the optimizer states commit (Note [State tiers],
//     state_tier.h), so a failed step changes no shard.
// Initial values, checkpoints and state dicts go through Write(), which
// rounds f32 values to param_dtype as the step rounds them, wherever the
// group lives.
//
// Owns the buffers, the file and its pages; borrows the config, layout and
// device, which must outlive it. Not thread-safe.
#ifndef MEMWALL_SHARDING_PARAM_RESIDENCE_H_
#define MEMWALL_SHARDING_PARAM_RESIDENCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "offload/nvme_store.h"
#include "runtime/device.h"
#include "sharding/flat_layout.h"
#include "sharding/options.h"
#include "sharding/param_pages.h"
#include "sharding/parameter_gatherer.h"
#include "sharding/stage_rules.h"

namespace memwall {

// Copies `count` f32 `values` to the device through a workspace owned by
// `owner` and casts them into `dst` as `dtype` on `stream`, then waits. On
// meta (`values` null) only the workspace is allocated, as a real run
// allocates it, so that both allocators stay in step.
absl::Status UploadF32(Device& device, Stream& stream, const float* values, int64_t count,
                       void* dst, DType dtype, absl::string_view owner);

class ParamResidence {
 public:
  enum class Place { kDevice, kPinned, kNvme };

  // Plans each group's place. `store` is the file for shards on NVMe (with
  // offload_param_nvme_path; null otherwise): the groups past the first
  // offload_param.max_in_cpu elements of shards, in group order, go there,
  // and the largest of them must fit a page of offload_param.buffer_size
  // elements (kInvalidArgument naming the key otherwise). Nothing is
  // allocated yet.
  static absl::StatusOr<std::unique_ptr<ParamResidence>> Create(const ShardingOptions& config,
                                                                const FlatLayout& layout,
                                                                Device& device,
                                                                std::unique_ptr<NvmeStore> store);

  // Allocates group g's place (a buffer of what the rank holds, or a slot
  // in the file); in group order, before AllocatePages.
  absl::Status Allocate(int g);
  // After every group's Allocate: the page buffers shards on NVMe pass
  // through (offload_param.buffer_count of them, each the largest shard
  // there); nothing without the file.
  absl::Status AllocatePages();

  Place place(int g) const { return groups_[g].place; }
  // The parameters the rank holds of group g (device or pinned memory);
  // null for a group on NVMe.
  void* data(int g) const { return groups_[g].held.data(); }
  // Group g's shard at rest, for the gatherer.
  ParameterGatherer::Shard shard(int g) const {
    return ParameterGatherer::Shard{groups_[g].held.data(), groups_[g].slot};
  }
  // The NVMe file and its pages (null without offload_param_nvme_path).
  ParamPages* pages() { return pages_.get(); }
  NvmeStore* store() { return pages_ != nullptr ? &pages_->store() : nullptr; }

  // Writes the f32 values of what the rank holds of group g (`values`
  // null on meta: nothing is written), rounded to param_dtype, and waits:
  // on the device through an f32 workspace owned by `owner` and cast on
  // `stream` (UploadF32), in the pinned pool by the CPU, on NVMe through a
  // page into the slot, committed.
  absl::Status Write(int g, const float* values, Stream& stream, absl::string_view owner);

  // The step's update of shards on NVMe, in two phases: the bytes a
  // refreshed shard of group g takes (the step's scratch holds the largest;
  // 0 for a group elsewhere); each refreshed shard (param_dtype, at
  // `scratch`) written to its slot's spare copy; once every group has
  // updated, the spare copies synced (FinishUpdates), and once the
  // optimizer states have committed, made current (CommitUpdates).
  int64_t update_bytes(int g) const;
  absl::Status WriteUpdated(int g, const void* scratch);
  absl::Status FinishUpdates(absl::Span<const int> groups);
  absl::Status CommitUpdates(absl::Span<const int> groups);
  // Lets every read ahead of a shard go (the step's end and an abandoned
  // step: the update rewrites the shards).
  void DropReadAheads();

 private:
  struct Group {
    Place place = Place::kDevice;
    DeviceBuffer held;  // kDevice, kPinned
    int slot = -1;      // kNvme: the slot in pages_' store
  };
  ParamResidence(const ShardingOptions& config, const FlatLayout& layout, Device& device)
      : config_(config), layout_(layout), device_(device) {}

  const ShardingOptions& config_;
  const FlatLayout& layout_;
  Device& device_;
  const StageRules rules_{config_.zero.stage};
  std::vector<Group> groups_;
  std::unique_ptr<ParamPages> pages_;
  int64_t largest_on_nvme_ = 0;  // elements
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_PARAM_RESIDENCE_H_
