// The pipeline an NVMe-tier update streams its state through (Note in
// sharding/host_optimizer.h): chunks of the store's slots, each read from
// the committed copy into one of a few pinned buffers, updated there by the
// CPU, and written from it to the spare copy at the same place.
//
// The chunks of several slots queue in one stream, in the order they will
// be updated: an optimizer queues every offloaded group's chunks before its
// step updates the first group, so reads run ahead past the end of one
// group into the next, the last writes of a group finish while the next one
// updates, and Finish syncs the file once for the whole step. A stream over
// one slot's chunks is the update of one group alone.
//
// Reads run up to count - 2 chunks ahead of the chunk being updated, and a
// buffer is read into only once its previous chunk's write has finished,
// so a write has one chunk's update to finish before it is waited for.
// With a virtual store (meta) the stream moves nothing and its buffers are
// null, but it starts and counts the transfers a real one would. Not
// thread-safe.
#ifndef MEMWALL_OFFLOAD_NVME_CHUNK_STREAM_H_
#define MEMWALL_OFFLOAD_NVME_CHUNK_STREAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/nvme_store.h"

namespace memwall {

class NvmeChunkStream {
 public:
  // A set of chunk buffers: how many, of how many bytes each, and the
  // bytes they take with room to align them (what to allocate).
  struct Buffers {
    int count = 0;
    int64_t stride = 0;
    int64_t bytes() const { return count * stride + NvmeStore::kAlignment; }
  };

  // `buffers`: `count` buffers of `stride` bytes each, back to back,
  // NvmeStore::kAlignment-aligned (null with a virtual store), which must
  // outlive the stream; `store` too.
  NvmeChunkStream(NvmeStore& store, char* buffers, int count, int64_t stride);
  // Waits for every transfer still in flight (an update that failed half
  // way leaves none touching the buffers), committing nothing.
  ~NvmeChunkStream();
  NvmeChunkStream(const NvmeChunkStream&) = delete;
  NvmeChunkStream& operator=(const NvmeChunkStream&) = delete;

  // Queues bytes [offset, offset + bytes) of `slot` (a multiple of
  // NvmeStore::kAlignment, at most the stride) as the next chunk.
  void Add(int slot, int64_t offset, int64_t bytes);
  // The slot of the chunk Next() returns next; -1 when every queued chunk
  // has been taken.
  int next_slot() const;
  // The next queued chunk's buffer once its committed bytes are in it,
  // having started the reads ahead. The error of any transfer waited for
  // (its own read, or an earlier chunk's write whose buffer a read reuses),
  // naming the file; kFailedPrecondition if no chunk is queued or the last
  // one taken has not been written.
  absl::StatusOr<char*> Next();
  // Starts writing the chunk Next() returned last, from its buffer, to its
  // slot's spare copy (nothing if it is being written already).
  void Write();
  // Waits for every transfer, then syncs the file once and makes each
  // slot written the one NvmeStore::Commit commits (FinishWrites). The
  // first error of any transfer or of the sync; kFailedPrecondition if a
  // queued chunk was not updated and written (nothing then is made
  // committable).
  absl::Status Finish();

 private:
  struct Chunk {
    int slot;
    int64_t offset, bytes;
  };
  char* Buffer(int64_t chunk) const;

  NvmeStore& store_;
  char* const buffers_;
  const int count_;
  const int64_t stride_;
  std::vector<Chunk> chunks_;
  // Per buffer, the transfer of the chunk it holds.
  std::vector<NvmeStore::Pending> reads_, writes_;
  int64_t read_ = 0;        // chunks whose read has started
  int64_t taken_ = 0;       // chunks Next() returned
  int64_t written_ = 0;     // chunks whose write has started
  std::vector<int> slots_;  // written, each once
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_NVME_CHUNK_STREAM_H_
