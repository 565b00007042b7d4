#include "sharding/param_residence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::Status UploadF32(Device& device, Stream& stream, const float* values, int64_t count,
                       void* dst, DType dtype, absl::string_view owner) {
  MW_ASSIGN_OR_RETURN(DeviceBuffer staging,
                      device.Allocate(count * 4, MemoryCategory::kWorkspace, owner));
  if (values == nullptr) return absl::OkStatus();
  MW_RETURN_IF_ERROR(device.CopyAsync(staging.data(), values, count * 4, stream));
  MW_RETURN_IF_ERROR(kernels::Cast(device, stream, staging.data(), DType::kF32, dst, dtype, count));
  return stream.Synchronize();
}

absl::StatusOr<std::unique_ptr<ParamResidence>> ParamResidence::Create(
    const ShardingOptions& config, const FlatLayout& layout, Device& device,
    std::unique_ptr<NvmeStore> store) {
  std::unique_ptr<ParamResidence> r(new ParamResidence(config, layout, device));
  const size_t n = layout.groups.size();
  r->groups_.resize(n);
  for (Group& group : r->groups_) {
    group.place = config.zero.offload_param ? Place::kPinned : Place::kDevice;
  }
  if (store == nullptr) return r;
  int64_t in_cpu = 0;
  for (size_t g = 0; g < n; ++g) {
    const int64_t shard = layout.groups[g].shard_numel;
    const bool on_nvme = (g > 0 && r->groups_[g - 1].place == Place::kNvme) ||
                         in_cpu + shard > config.zero.offload_param_max_in_cpu;
    if (!on_nvme) {
      in_cpu += shard;
      continue;
    }
    r->groups_[g].place = Place::kNvme;
    r->largest_on_nvme_ = std::max(r->largest_on_nvme_, shard);
  }
  if (r->largest_on_nvme_ > config.zero.offload_param_buffer_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_param.buffer_size: expected at least ", r->largest_on_nvme_,
        " (elements of the largest parameter shard on NVMe, one page buffer each), got ",
        config.zero.offload_param_buffer_size));
  }
  r->pages_ = std::make_unique<ParamPages>(device, std::move(store));
  return r;
}

absl::Status ParamResidence::Allocate(int g) {
  const FlatGroup& flat = layout_.groups[g];
  const int64_t bytes = rules_.held_parameters(flat) * DTypeSize(config_.param_dtype());
  Group& group = groups_[g];
  if (group.place == Place::kNvme) {
    MW_ASSIGN_OR_RETURN(group.slot, pages_->store().AddSlot(bytes));
    return absl::OkStatus();
  }
  MW_ASSIGN_OR_RETURN(group.held,
                      group.place == Place::kPinned
                          ? device_.AllocatePinned(bytes, MemoryCategory::kParameter, flat.name)
                          : device_.Allocate(bytes, MemoryCategory::kParameter, flat.name));
  return absl::OkStatus();
}

absl::Status ParamResidence::AllocatePages() {
  if (largest_on_nvme_ == 0) return absl::OkStatus();
  return pages_->AllocatePages(config_.zero.offload_param_buffer_count,
                               largest_on_nvme_ * DTypeSize(config_.param_dtype()));
}

absl::Status ParamResidence::Write(int g, const float* values, Stream& stream,
                                   absl::string_view owner) {
  const FlatGroup& flat = layout_.groups[g];
  const DType dtype = config_.param_dtype();
  const int64_t held = rules_.held_parameters(flat);
  switch (groups_[g].place) {
    case Place::kNvme:
      return pages_->WriteFromF32(groups_[g].slot, values, held, dtype);
    case Place::kPinned:
      // The CPU's memory: rounded there.
      if (values != nullptr) {
        kernels::cpu::Kernels().cast(values, DType::kF32, groups_[g].held.data(), dtype, held);
      }
      return absl::OkStatus();
    case Place::kDevice:
      return UploadF32(device_, stream, values, held, groups_[g].held.data(), dtype, owner);
  }
  return absl::OkStatus();
}

int64_t ParamResidence::update_bytes(int g) const {
  return groups_[g].place == Place::kNvme ? pages_->store().rounded_bytes(groups_[g].slot) : 0;
}

absl::Status ParamResidence::WriteUpdated(int g, const void* scratch) {
  return pages_->store().WriteUnsynced(groups_[g].slot, scratch);
}

absl::Status ParamResidence::FinishUpdates(absl::Span<const int> groups) {
  if (groups.empty()) return absl::OkStatus();
  std::vector<int> slots;
  for (int g : groups) slots.push_back(groups_[g].slot);
  return pages_->store().FinishWrites(slots);
}

absl::Status ParamResidence::CommitUpdates(absl::Span<const int> groups) {
  for (int g : groups) MW_RETURN_IF_ERROR(pages_->store().Commit(groups_[g].slot));
  return absl::OkStatus();
}

void ParamResidence::DropReadAheads() {
  if (pages_ != nullptr) pages_->DropReadAheads();
}

}  // namespace memwall
