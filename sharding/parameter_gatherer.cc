#include "sharding/parameter_gatherer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "sharding/quantized_records.h"

namespace memwall {

ParameterGatherer::ParameterGatherer(const ShardingOptions& config, const FlatLayout& layout,
                                     Device& device, Communicator& comm,
                                     Communicator* secondary, Stream& caller,
                                     Stream& comm_stream, ParamPages* pages, ShardOf shard_of,
                                     OrderAfterCaller order_after_caller)
    : config_(config),
      layout_(layout),
      device_(device),
      comm_(comm),
      secondary_(secondary),
      caller_(caller),
      comm_stream_(comm_stream),
      pages_(pages),
      shard_of_(std::move(shard_of)),
      order_after_caller_(std::move(order_after_caller)),
      groups_(layout.groups.size()),
      scheduler_(static_cast<int>(layout.groups.size())) {}

absl::StatusOr<DeviceBuffer> ParameterGatherer::GatherInto(int g, bool quantize,
                                                           bool secondary) {
  // The gathered buffer may reuse a block the caller's queued work still
  // reads: the gather waits for that work.
  MW_RETURN_IF_ERROR(order_after_caller_());
  const FlatGroup& flat = layout_.groups[g];
  const DType dtype = config_.param_dtype();
  // The caller's stream's: it reads the buffer after waiting for the
  // gather, and frees it.
  MW_ASSIGN_OR_RETURN(DeviceBuffer full,
                      device_.Allocate(flat.padded_numel * DTypeSize(dtype),
                                       MemoryCategory::kParameter,
                                       absl::StrCat(flat.name, ".gathered"), caller_));
  DeviceBuffer& kept = groups_[g].secondary;
  const int64_t slice = secondary_ != nullptr ? flat.padded_numel / secondary_->world_size() : 0;
  if (secondary && !kept.empty()) {
    MW_RETURN_IF_ERROR(
        secondary_->AllGather(kept.data(), full.data(), slice, dtype, comm_stream_));
    return full;
  }
  // Paging: the shard comes in from the pinned pool straight into its own
  // place in the gathered buffer, in stream order, and the all-gather runs
  // in place: no staging copy on the device.
  // From NVMe, through a page buffer.
  const Shard at_rest = shard_of_(g);
  const void* shard = at_rest.data;
  if (config_.zero.offload_param) {
    void* own = ElementOffset(full.data(), flat.shard_begin(comm_.rank()), dtype);
    Event* copied = nullptr;
    if (at_rest.slot >= 0) {
      MW_ASSIGN_OR_RETURN(const ParamPages::Page page, pages_->ReadForGather(g, at_rest.slot));
      shard = page.data;
      copied = page.copied;
    }
    MW_RETURN_IF_ERROR(
        device_.CopyAsync(own, shard, flat.shard_numel * DTypeSize(dtype), comm_stream_));
    if (copied != nullptr) MW_RETURN_IF_ERROR(comm_stream_.Record(*copied));
    shard = own;
  }
  if (quantize) {
    MW_RETURN_IF_ERROR(QuantizedGather(flat, shard, full.data()));
  } else {
    MW_RETURN_IF_ERROR(
        comm_.AllGather(shard, full.data(), flat.shard_numel, dtype, comm_stream_));
  }
  if (secondary) {
    // This rank's place in its block: the slice the block's gather puts there.
    MW_ASSIGN_OR_RETURN(kept, device_.Allocate(slice * DTypeSize(dtype),
                                               MemoryCategory::kParameter,
                                               absl::StrCat(flat.name, ".secondary"),
                                               comm_stream_));
    MW_RETURN_IF_ERROR(device_.CopyAsync(
        kept.data(), ElementOffset(full.data(), secondary_->rank() * slice, dtype),
        slice * DTypeSize(dtype), comm_stream_));
  }
  return full;
}

absl::Status ParameterGatherer::QuantizedGather(const FlatGroup& flat, const void* shard,
                                                void* full) {
  const DType dtype = config_.param_dtype();
  // Every rank's shard as one record: one collective per gather.
  const QuantizedRecords records(flat.shard_numel, config_.zero.quantization_block_size);
  const int ranks = comm_.world_size(), me = comm_.rank();
  // The communication stream's: freed in its order once dequantized.
  MW_ASSIGN_OR_RETURN(DeviceBuffer packed,
                      device_.Allocate(records.words() * 4 * ranks, MemoryCategory::kParameter,
                                       absl::StrCat(flat.name, ".quantized"), comm_stream_));
  MW_RETURN_IF_ERROR(records.Quantize(device_, comm_stream_, shard, dtype, packed.data(), me));
  MW_RETURN_IF_ERROR(comm_.AllGather(static_cast<char*>(packed.data()) + me * records.words() * 4,
                                     packed.data(), records.words(), DType::kF32, comm_stream_));
  for (int r = 0; r < ranks; ++r) {
    MW_RETURN_IF_ERROR(records.Dequantize(device_, comm_stream_, packed.data(), r,
                                          ElementOffset(full, flat.shard_begin(r), dtype), dtype));
  }
  return absl::OkStatus();
}

absl::Status ParameterGatherer::Start(int g, bool prefetch) {
  Gathered& gathered = groups_[g];
  MW_ASSIGN_OR_RETURN(gathered.buffer, GatherInto(g, config_.zero.quantized_weights,
                                                  /*secondary=*/secondary_ != nullptr));
  if (gathered.event == nullptr) {
    MW_ASSIGN_OR_RETURN(gathered.event, device_.CreateEvent());
  }
  MW_RETURN_IF_ERROR(comm_stream_.Record(*gathered.event));
  gathered.prefetched = prefetch;
  return absl::OkStatus();
}

absl::Status ParameterGatherer::Prefetch() {
  // Gathers ahead overlap only on an asynchronous stream; the disk reads
  // of shards on NVMe run beside the caller whatever its streams.
  const bool gathers_ahead = comm_stream_.asynchronous();
  if (!gathers_ahead && pages_ == nullptr) return absl::OkStatus();
  int64_t live = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (!groups_[i].buffer.empty()) live += layout_.groups[i].padded_numel;
  }
  int64_t ahead = 0;
  for (int next : scheduler_.Upcoming()) {
    const int64_t size = layout_.groups[next].padded_numel;
    if (!groups_[next].buffer.empty()) continue;
    if (ahead + size > config_.zero.stage3_prefetch_bucket_size) break;
    if (const int slot = shard_of_(next).slot; slot >= 0) {
      // On NVMe the read is the slow part: it starts now; the gather
      // (holding device memory) waits until the group is used.
      MW_RETURN_IF_ERROR(pages_->ReadAhead(next, slot));
      if (pages_->ReadsAhead(next)) ahead += size;
      continue;
    }
    if (!gathers_ahead) continue;
    if (live + size > config_.zero.stage3_max_live_parameters) break;
    MW_RETURN_IF_ERROR(Start(next, /*prefetch=*/true));
    ahead += size;
    live += size;
  }
  return absl::OkStatus();
}

absl::Status ParameterGatherer::Gather(int g) {
  Gathered& gathered = groups_[g];
  if (!gathered.buffer.empty() && !gathered.prefetched) {
    return absl::FailedPreconditionError(
        absl::StrCat("GatherParameters: group ", g, " is already gathered"));
  }
  if (gathered.buffer.empty()) MW_RETURN_IF_ERROR(Start(g, /*prefetch=*/false));
  gathered.prefetched = false;
  scheduler_.OnGather(g);
  // Queue the next gathers before waiting, so they run while the caller
  // computes with this group.
  MW_RETURN_IF_ERROR(Prefetch());
  // The caller's stream waits for the gather; the host does not (on host,
  // whose compute stream runs work as it is enqueued, the wait is now).
  return caller_.Wait(*gathered.event);
}

void ParameterGatherer::Release(int g) {
  Gathered& gathered = groups_[g];
  if (gathered.prefetched) return;  // not the caller's to release
  // Freed in stream order: the caller's queued work may still read it, and
  // the next gather into its block waits for that work.
  gathered.buffer.Reset();
}

const DeviceBuffer* ParameterGatherer::held(int g) const {
  const Gathered& gathered = groups_[g];
  return gathered.buffer.empty() || gathered.prefetched ? nullptr : &gathered.buffer;
}

absl::StatusOr<const DeviceBuffer*> ParameterGatherer::GatherForRead(int g,
                                                                      DeviceBuffer& scratch) {
  if (!groups_[g].buffer.empty() && !config_.zero.quantized_weights) return &groups_[g].buffer;
  MW_ASSIGN_OR_RETURN(scratch, GatherInto(g, /*quantize=*/false, /*secondary=*/false));
  return &scratch;
}

void ParameterGatherer::Drop(int g) {
  groups_[g].buffer.Reset();
  groups_[g].prefetched = false;
}

void ParameterGatherer::EndStep() {
  scheduler_.EndStep();
  for (Gathered& gathered : groups_) {
    if (gathered.prefetched) gathered.buffer.Reset();
    gathered.prefetched = false;
    gathered.secondary.Reset();
  }
}

void ParameterGatherer::AbortStep() {
  for (Gathered& gathered : groups_) {
    gathered.buffer.Reset();
    gathered.prefetched = false;
    gathered.secondary.Reset();
  }
  scheduler_.AbortStep();
}

}  // namespace memwall
