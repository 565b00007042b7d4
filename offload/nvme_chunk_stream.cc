#include "offload/nvme_chunk_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

NvmeChunkStream::NvmeChunkStream(NvmeStore& store, char* buffers, int count, int64_t stride)
    : store_(store),
      buffers_(buffers),
      count_(count),
      stride_(stride),
      reads_(count),
      writes_(count) {}

NvmeChunkStream::~NvmeChunkStream() {
  for (NvmeStore::Pending& p : writes_) (void)store_.Wait(p);
  for (NvmeStore::Pending& p : reads_) (void)store_.Wait(p);
}

void NvmeChunkStream::Add(int slot, int64_t offset, int64_t bytes) {
  chunks_.push_back(Chunk{slot, offset, bytes});
}

int NvmeChunkStream::next_slot() const {
  return taken_ < static_cast<int64_t>(chunks_.size()) ? chunks_[taken_].slot : -1;
}

char* NvmeChunkStream::Buffer(int64_t chunk) const {
  return buffers_ == nullptr ? nullptr : buffers_ + (chunk % count_) * stride_;
}

absl::StatusOr<char*> NvmeChunkStream::Next() {
  const int64_t queued = static_cast<int64_t>(chunks_.size());
  if (taken_ == queued || written_ != taken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe chunk stream of ", store_.path(), ": ",
                     taken_ == queued ? "no chunk queued" : "the last chunk taken is not written",
                     " (", taken_, " of ", queued, " taken)"));
  }
  const int64_t ahead = std::max(count_ - 2, 0);
  for (; read_ < queued && read_ <= taken_ + ahead; ++read_) {
    const int b = static_cast<int>(read_ % count_);
    // The buffer's previous chunk is on disk before it is read over.
    MW_RETURN_IF_ERROR(store_.Wait(writes_[b]));
    const Chunk& c = chunks_[read_];
    reads_[b] = store_.ReadPart(c.slot, c.offset, c.bytes, Buffer(read_));
  }
  MW_RETURN_IF_ERROR(store_.Wait(reads_[taken_ % count_]));
  return Buffer(taken_++);
}

void NvmeChunkStream::Write() {
  if (written_ == taken_) return;  // Finish reports the chunk not written
  const Chunk& c = chunks_[written_];
  writes_[written_ % count_] = store_.WritePart(c.slot, c.offset, c.bytes, Buffer(written_));
  if (std::find(slots_.begin(), slots_.end(), c.slot) == slots_.end()) slots_.push_back(c.slot);
  ++written_;
}

absl::Status NvmeChunkStream::Finish() {
  absl::Status status = absl::OkStatus();
  for (NvmeStore::Pending& p : writes_) {
    const absl::Status w = store_.Wait(p);
    if (status.ok()) status = w;
  }
  for (NvmeStore::Pending& p : reads_) (void)store_.Wait(p);
  MW_RETURN_IF_ERROR(status);
  if (written_ != static_cast<int64_t>(chunks_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("NVMe chunk stream of ", store_.path(), ": ",
                                                      written_, " of ", chunks_.size(),
                                                      " chunks updated"));
  }
  return store_.FinishWrites(slots_);
}

}  // namespace memwall
