#include "sharding/overlapped_update.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<OverlappedUpdate>> OverlappedUpdate::Create(Device& device,
                                                                           std::vector<int> cores) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  return std::unique_ptr<OverlappedUpdate>(
      new OverlappedUpdate(device, std::move(cores), std::move(stream)));
}

OverlappedUpdate::~OverlappedUpdate() { Wait(); }

void OverlappedUpdate::SetGroups(int groups, NvmeStore* nvme, NvmeChunkStream::Buffers chunks) {
  groups_.resize(groups);
  nvme_ = nvme;
  chunks_ = chunks;
}

std::unique_ptr<NvmeChunkStream> OverlappedUpdate::ChunksAlone(const HostOptimizerSlice& host) {
  if (chunks_.count == 0) return nullptr;
  auto chunks = std::make_unique<NvmeChunkStream>(*nvme_, NvmeStore::AlignUp(chunk_buffers_.data()),
                                                  chunks_.count, chunks_.stride);
  host.QueueChunks(*chunks);
  return chunks;
}

absl::Status OverlappedUpdate::Hand(int g, HostOptimizerSlice& host, const std::string& name,
                                    std::vector<StateTier::Segment> segments, Stream& comm_stream,
                                    MemoryProfiler* profiler) {
  Handed& handed = groups_[g];
  // Buffers here, on the caller's thread; the NVMe tier's shared chunk
  // buffers once.
  if (chunks_.count > 0 && chunk_buffers_.empty()) {
    MW_ASSIGN_OR_RETURN(chunk_buffers_,
                        device_.AllocatePinned(chunks_.bytes(), MemoryCategory::kWorkspace,
                                               "optimizer.nvme_buffers"));
  }
  MW_ASSIGN_OR_RETURN(handed.params,
                      device_.AllocatePinned(host.scratch_bytes(), MemoryCategory::kWorkspace,
                                             absl::StrCat(name, ".host_params")));
  if (handed.staged == nullptr) {
    MW_ASSIGN_OR_RETURN(handed.staged, device_.CreateEvent());
  }
  MW_RETURN_IF_ERROR(comm_stream.Record(*handed.staged));
  handed.segments = std::move(segments);
  handed.handed = true;
  StateTier::UpdateArgs args;
  args.segments = handed.segments;
  args.scratch = handed.params.data();
  // One group at a time on the update thread: each streams alone.
  std::shared_ptr<NvmeChunkStream> chunks = ChunksAlone(host);
  args.nvme_stream = chunks.get();
  HostOptimizerSlice* slice = &host;
  Event* staged = handed.staged.get();
  Stream* stream = stream_.get();
  worker_.Enqueue([slice, staged, stream, args, profiler, chunks, name] {
    MW_RETURN_IF_ERROR(staged->Synchronize());
    ScopedActivity activity(profiler, kCpuUpdateTrack, absl::StrCat("update ", name));
    MW_RETURN_IF_ERROR(slice->Update(*stream, args));
    return chunks != nullptr ? chunks->Finish() : absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status OverlappedUpdate::Finish() {
  absl::Status status = worker_.Wait();
  if (!status.ok()) {
    // Step() fails before anything changed; a retry updates afresh.
    for (int g = 0; g < static_cast<int>(groups_.size()); ++g) Drop(g);
  }
  return status;
}

void OverlappedUpdate::Drop(int g) {
  groups_[g].handed = false;
  groups_[g].params.Reset();
}

void OverlappedUpdate::Wait() { (void)worker_.Wait(); }

}  // namespace memwall
