// ParamPages: the parameter shards ShardedOptimizer keeps on NVMe
// (offload_param_nvme_path), and the pinned page buffers every transfer
// of them passes through.
//
// A gather reads a shard into the next free page and pages it in to the
// device from there; the page is reused once the copy out of it has run
// (its `copied` event). Prefetching reads the upcoming groups' shards
// ahead, through the store's asynchronous I/O, into all but one page (so a
// gather or a write always finds one); a read ahead whose gather does not
// come is dropped when the step ends, before the update rewrites the
// shards. Writes round f32 values to the parameter dtype in a page and
// write the shard's spare copy, committed by the caller (two copies per
// shard, offload/nvme_store.h).
//
// Owns the store and the pages; borrows the device. Not thread-safe.
#ifndef MEMWALL_SHARDING_PARAM_PAGES_H_
#define MEMWALL_SHARDING_PARAM_PAGES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/nvme_store.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {

class ParamPages {
 public:
  // A page buffer: where its bytes are, the event a copy out of it
  // records, and its index.
  struct Page {
    void* data;
    Event* copied;
    int index;
  };

  ParamPages(Device& device, std::unique_ptr<NvmeStore> store)
      : device_(device), store_(std::move(store)) {}
  // Waits for the reads ahead still under way (they write into the pages).
  ~ParamPages() { DropReadAheads(); }

  // The shards' file: slots are added as groups are allocated.
  NvmeStore& store() { return *store_; }

  // Allocates `count` page buffers (pinned, category workspace), each of
  // `shard_bytes` rounded up to whole blocks for O_DIRECT, and their
  // events. Once, after the slots.
  absl::Status AllocatePages(int count, int64_t shard_bytes);

  // The page holding group g's shard (`slot`) for its gather: the page it
  // was read ahead into, once that read has finished, or else the next
  // free page with the shard read into it now.
  absl::StatusOr<Page> ReadForGather(int g, int slot);
  // Starts reading group g's shard into a page, unless one is under way or
  // it would leave no page free (then nothing is read ahead).
  absl::Status ReadAhead(int g, int slot);
  // Whether group g's shard is being read ahead.
  bool ReadsAhead(int g) const { return ReadAheadPage(g) >= 0; }
  // Lets every read ahead go (waiting for it: it writes into a page).
  void DropReadAheads();

  // Rounds `count` f32 values (null on meta) to `dtype` in the next free
  // page and writes them to slot's spare copy, then commits it.
  absl::Status WriteFromF32(int slot, const float* from, int64_t count, DType dtype);

 private:
  struct PageRead {
    int group = -1;  // -1: none
    NvmeStore::Pending read;
  };
  // The next page holding no read ahead, once the copy out of it has run.
  absl::StatusOr<Page> Take();
  Page At(int i);
  int ReadAheadPage(int g) const;

  Device& device_;
  std::unique_ptr<NvmeStore> store_;
  // One block of aligned pages, stride_ bytes apart.
  DeviceBuffer pages_;
  int64_t stride_ = 0;
  std::vector<std::unique_ptr<Event>> copied_;
  std::vector<PageRead> reads_;  // per page
  int next_ = 0;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_PARAM_PAGES_H_
