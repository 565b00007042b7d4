// The host tier of a rank's optimizer state (Note [State tiers] in
// sharding/state_tier.h), the CPU half of ZeRO-Offload: one slice of a flat group's f32 master
// weights and optimizer moments, kept in a device's pinned host pool
// (category optimizer_state) or, with an NvmeStore, in a file on a fast
// local disk (the NVMe tier), and updated by the CPU kernels on
// MEMWALL_CPU_THREADS threads. The CPU kernels share the device kernels'
// element math (kernels/elementwise.h), so a slice updated here ends bit for
// bit where the device update would have.
//
// A step is two-phase so that an NVMe failure leaves no half-updated state:
// Update() computes the new state (on NVMe: written to the file's spare
// copy) and the refreshed parameters, into pinned scratch the caller
// provides; Commit() then makes them current and copies the parameters
// out. On NVMe the state streams through a bounded set of pinned buffers:
// the slot is laid out in chunks (each chunk's master weights, then its
// moments, contiguous), and Update reads chunks ahead into nvme_buffer_count
// buffers while it updates the current one and writes the previous one
// behind, through the store's asynchronous engine (offload/nvme_chunk_stream.h).
// A caller that updates several slices of one store may queue all their
// chunks on one stream first (QueueChunks, UpdateArgs::nvme_stream): the
// reads then run ahead into the next slice and the writes finish behind
// while it updates, and one NvmeChunkStream::Finish syncs them all. On NVMe
// a caller updates every slice, then commits every slice; if an Update
// fails it commits none. The pinned tier updates in place, and
// once its scratch exists nothing in Update can fail: a caller updates and
// commits each slice in turn through one scratch buffer sized for the
// largest, allocated before the first update (the refreshed parameters of
// a whole model never sit in host memory at once).
//
// A pinned slice created `speculative` (for a step that updates on the CPU
// while backward runs, sharding/sharded_optimizer.h) keeps a spare copy of
// its state and is two-phase too: Update writes the new state into
// the spare copy, so an update computed before the step knew its clipping
// factor or its overflow can be dropped (Discard) or computed again from the
// untouched current state, and Commit swaps the copies.
#ifndef MEMWALL_SHARDING_HOST_OPTIMIZER_H_
#define MEMWALL_SHARDING_HOST_OPTIMIZER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "offload/nvme_chunk_stream.h"
#include "offload/nvme_store.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "sharding/state_tier.h"

namespace memwall {

// The profiler track the host part's CPU updates are recorded on (at the
// step, or on the overlapped update's thread).
inline constexpr char kCpuUpdateTrack[] = "cpu update";

class HostOptimizerSlice final : public StateTier {
 public:
  // `numel` elements of master weights plus Adam's two moments or SGD's
  // momentum buffer (when `momentum`): in `device`'s pinned pool as
  // "<owner>.master", ".exp_avg", ".exp_avg_sq" or ".momentum", or, given
  // `store` (which must outlive the slice), in one slot of it. Also the
  // gradients' landing buffer ("<owner>.grad_host", pinned, category
  // gradient, parameter dtype). Moments start at zero, master weights at
  // zero until WriteState. Errors: kFailedPrecondition without a pinned
  // pool; kResourceExhausted naming the pool (or the file) when it is full,
  // with nothing left allocated.
  struct Options {
    // Set: the NVMe tier, this file (which must outlive the slice); the
    // state streams through `nvme_buffer_count` pinned buffers of about
    // `nvme_buffer_bytes` each (whole chunks of 1024 elements).
    NvmeStore* store = nullptr;
    int64_t nvme_buffer_bytes = int64_t{8} << 20;
    int nvme_buffer_count = 4;
    // Pinned tier: a spare copy of the state (".<state>_spare",
    // optimizer_state) for updates that must keep the current one (the
    // NVMe tier always keeps it: its spare copy is on disk).
    bool speculative = false;
    // Threads of the CPU update (0: MEMWALL_CPU_THREADS,
    // kernels/cpu/parallel.h).
    int threads = 0;
    // NVMe tier: the gradients go to a scratch slot of the file too (when
    // the parameters are on NVMe, so host memory holds buffers only): each
    // reduction lands in a pinned buffer of the slice's size (read back
    // first to accumulate a later micro-batch) and is written out once
    // complete; Update reads them into UpdateArgs::grad_buffer.
    bool gradients_on_nvme = false;
  };
  static absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> Create(
      Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
      absl::string_view owner, const Options& options);
  static absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> Create(
      Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
      absl::string_view owner) {
    return Create(device, rule, momentum, param_dtype, numel, owner, Options());
  }

  // Elements a speculative SGD update copies to the spare and updates at a
  // time (in cache: 128 KiB per f32 array); Adam updates out of place.
  static constexpr int64_t kSpeculativeChunk = 32768;

  int64_t numel() const override { return numel_; }

  // The f32 arrays a slice keeps: master weights, then Adam's m and v (or
  // SGD's momentum buffer).
  int num_states() const override { return states_; }
  // Elements [begin, begin + count) of committed state `which` (0: master,
  // 1: first moment or momentum, 2: second moment) from `in`, or into
  // `out`. Nothing happens on meta. kOutOfRange for a range outside
  // numel() or a state the slice does not keep; NVMe errors name the file.
  absl::Status WriteState(int which, int64_t begin, int64_t count, const float* in) override;
  absl::Status ReadState(int which, int64_t begin, int64_t count, float* out) override;

  // Enqueues on `stream` the copy of `grads` (numel() elements of the
  // parameter dtype, device memory that stays valid until the stream has
  // run it) into the landing buffer: gradients stream to the host as soon
  // as they are final, while the caller goes on.
  absl::Status StageGradients(Stream& stream, const void* grads);
  // Pinned scratch bytes one Update needs: the refreshed parameters, held
  // until Commit (the update reads 16-bit gradients where they landed,
  // widening each as it goes: no f32 copy of them).
  int64_t scratch_bytes() const override;
  // NVMe tier: the pinned buffers an update of this slice alone streams
  // the state through, and the bytes each holds (a chunk: whole 4 KiB
  // blocks); 0 otherwise.
  int nvme_buffer_count() const;
  int64_t nvme_buffer_stride() const { return store_ == nullptr ? 0 : BufferBytes(); }
  // NVMe tier: queues this slice's chunks, in the order its Update takes
  // them, on `stream` (over the slice's store), for an Update given
  // UpdateArgs::nvme_stream.
  void QueueChunks(NvmeChunkStream& stream) const;
  // The NVMe tier updates into the file's spare copy, a speculative slice
  // into its own.
  bool two_phase() const override { return store_ != nullptr || speculative_; }
  // Phase one of a step from the staged gradients: waits for `stream`,
  // computes the new master weights and moments (pinned: in place; NVMe:
  // into the file's spare copy) and the refreshed parameters.
  // `args.segments` give the hyperparameters (adam or sgd, by the slice's
  // rule) of each run of elements; `args.scratch`: scratch_bytes() of
  // pinned memory (null on meta), left alone by the caller until Commit.
  // On NVMe the state streams through `args.nvme_stream` (this slice's
  // chunks queued next, by QueueChunks), the update returning with its
  // last writes under way and the caller's NvmeChunkStream::Finish due
  // before Commit; without one, through buffers of its own
  // (nvme_buffer_count() x nvme_buffer_stride() pinned bytes), the file
  // synced before it returns. The other fields are the device tier's.
  // kFailedPrecondition if no gradients were staged since the last commit,
  // or if the stream's next chunk is not this slice's; kInvalidArgument for
  // bad settings in a segment (before anything changes). The staged
  // gradients stay until Commit, so a failed Update may be retried.
  absl::Status Update(Stream& stream, const UpdateArgs& args) override;
  // Phase two: makes the update current and writes the refreshed
  // parameters, in the parameter dtype, to `params` (device or pinned
  // memory). Returns once `stream` has run the copy.
  absl::Status Commit(Stream& stream, void* params) override;
  // For gradients that do not stay on the device: copies `grads` (`count`
  // elements of `dtype`, the reduction's dtype, in device memory) to pinned
  // staging and adds them into elements [begin, begin + count) of the
  // landing buffer on the CPU, which `first` (a step's first micro-batch)
  // zeroes before: the same arithmetic as the device's accumulating
  // reduction (widen, add, round once to the parameter dtype). Returns once
  // added. kOutOfRange if the range is not within numel().
  absl::Status AccumulateGradients(Stream& stream, const void* grads, DType dtype, bool first,
                                   int64_t begin, int64_t count);
  // Elements [begin, begin + count) of the gradients accumulated over the
  // step's earlier reductions (parameter dtype, pinned host memory, valid
  // until the next AccumulateGradients; null on a device without bytes),
  // read from NVMe first when they are there: hybrid sharding adds them to
  // the last reduction's before summing with the replicas, and that sum
  // then lands with `first`. kOutOfRange as AccumulateGradients.
  absl::StatusOr<const void*> EarlierGradients(int64_t begin, int64_t count);
  // A dry run's AccumulateGradients of elements [begin, begin + count)
  // whose pieces it counts rather than runs (each would do what the one
  // before it did): books them as landed, and on NVMe writes the landing
  // buffer out when they complete it, as the last real piece would.
  // kFailedPrecondition on a device that holds bytes; kOutOfRange as
  // AccumulateGradients.
  absl::Status SkipGradients(int64_t begin, int64_t count);
  // Whether the staged gradients hold an inf or nan, and their sum of
  // squares (each computed only if asked), as the CPU kernels scan the
  // landing buffer; with the gradients on NVMe, as they scanned it when the
  // last reduction completed. Nothing is computed on meta.
  kernels::GradientScan::Result ScanGradients(bool nonfinite, bool squares) const;
  // The pinned landing buffer (host memory; valid once `stream` has run
  // the copy); null with the gradients on NVMe.
  const void* gradients() const { return grads_.data(); }
  // Gradients on NVMe: the pinned bytes UpdateArgs::grad_buffer needs (0
  // otherwise).
  int64_t grad_buffer_bytes() const;

  // Forgets staged gradients (a skipped step) and an uncommitted update
  // (two-phase tiers: the current state stays as it was).
  void DropGradients() {
    staged_ = false;
    pending_ = nullptr;
    landing_ = {};
    landed_ = 0;
    landed_scan_ = {};
  }
  bool staged() const { return staged_; }

 private:
  HostOptimizerSlice(Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
                     std::string owner, bool speculative, int threads)
      : device_(device),
        rule_(rule),
        states_(rule == Rule::kAdam ? 3 : (momentum ? 2 : 1)),
        dtype_(param_dtype),
        numel_(numel),
        owner_(std::move(owner)),
        speculative_(speculative),
        threads_(threads) {}
  // kOutOfRange unless state `which` is kept and [begin, begin + count)
  // lies within numel().
  absl::Status CheckStateRange(int which, int64_t begin, int64_t count) const;
  // Pinned bytes aligned for O_DIRECT: the buffer and the aligned address.
  absl::StatusOr<std::pair<DeviceBuffer, char*>> Aligned(int64_t bytes, absl::string_view suffix);
  // The NVMe slot's chunks: how many, chunk c's elements, where it starts
  // in the slot and the bytes a transfer of it moves (rounded up to
  // NvmeStore::kAlignment), and the bytes of one pinned buffer.
  int64_t Chunks() const { return (numel_ + chunk_ - 1) / chunk_; }
  int64_t ChunkElements(int64_t c) const { return std::min(chunk_, numel_ - c * chunk_); }
  int64_t ChunkOffset(int64_t c) const { return c * states_ * chunk_ * 4; }
  int64_t ChunkIoBytes(int64_t c) const;
  int64_t BufferBytes() const { return ChunkIoBytes(0); }
  // Segment s's update of elements [i, i + n) whose state is at `master`
  // and the moments `m`, `v` (null where the rule keeps none), in place,
  // from the gradients `g` (all numel_, in the parameter dtype); the
  // refreshed 16-bit parameters go to `params` + i.
  void Apply(const Segment& s, int64_t i, int64_t n, float* master, const char* g, float* m,
             float* v, char* params) const;
  // The NVMe update of this slice's chunks, next in `stream`; on meta it
  // only takes and writes them (the store counts the transfers).
  absl::Status UpdateFromNvme(absl::Span<const Segment> segments, const char* g, char* params,
                              NvmeChunkStream& stream);

  Device& device_;
  const Rule rule_;
  const int states_;  // f32 arrays: master, then moments
  const DType dtype_;
  const int64_t numel_;
  const std::string owner_;
  const bool speculative_;
  const int threads_;  // for the CPU update (>= 1)
  NvmeStore* store_ = nullptr;
  int slot_ = -1;
  int64_t chunk_ = 0;   // NVMe: elements per chunk (a multiple of 1024)
  int nvme_count_ = 0;  // NVMe: pinned buffers an update streams through
  DeviceBuffer master_;  // pinned tier
  DeviceBuffer first_;   // Adam m, or SGD momentum (empty without)
  DeviceBuffer second_;  // Adam v
  // Speculative: the spare copy of master_, first_, second_ that Update
  // writes and Commit swaps in.
  DeviceBuffer spare_[3];
  DeviceBuffer grads_;   // the landing buffer, parameter dtype
  // Gradients on NVMe: their scratch slot, the reduction landing now (its
  // buffer and aligned address) and its elements so far, and the scan of
  // the last complete one.
  int grad_slot_ = -1;
  std::pair<DeviceBuffer, char*> landing_;
  int64_t landed_ = 0;
  // `count` more elements landed; on NVMe, a complete landing buffer is
  // scanned and written out.
  absl::Status Landed(int64_t count);
  // Where the gradients of elements [begin, begin + count) land (the base
  // of the pinned buffer, or of the NVMe landing buffer, created at the
  // step's first piece and then filled from the file when `earlier`
  // micro-batches' sums are there); kOutOfRange for a range past numel().
  absl::StatusOr<char*> Landing(int64_t begin, int64_t count, bool earlier);
  kernels::GradientScan::Result landed_scan_;
  const void* pending_ = nullptr;  // refreshed parameters (in the caller's scratch)
  bool staged_ = false;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_HOST_OPTIMIZER_H_
