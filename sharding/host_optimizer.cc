#include "sharding/host_optimizer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> HostOptimizerSlice::Create(
    Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
    absl::string_view owner, const Options& options) {
  NvmeStore* const store = options.store;
  const bool speculative = options.speculative;  // pinned tier only
  if (device.pinned_allocator() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "offloaded optimizer states of '", owner, "': ", device.name(),
        " has no pinned pool (DeviceOptions::pinned_capacity_bytes)"));
  }
  std::unique_ptr<HostOptimizerSlice> slice(
      new HostOptimizerSlice(device, rule, momentum, param_dtype, numel, std::string(owner),
                             speculative && !store, kernels::cpu::CpuThreadsOr(options.threads)));
  if (options.gradients_on_nvme && store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("offloaded optimizer states of '", owner,
                                                   "': gradients on NVMe need the NVMe tier"));
  }
  if (options.gradients_on_nvme) {
    MW_ASSIGN_OR_RETURN(slice->grad_slot_, store->AddScratchSlot(numel * DTypeSize(param_dtype)));
  } else {
    MW_ASSIGN_OR_RETURN(slice->grads_, device.AllocatePinned(numel * DTypeSize(param_dtype),
                                                             MemoryCategory::kGradient,
                                                             absl::StrCat(owner, ".grad_host")));
  }
  const size_t bytes = numel * sizeof(float);
  if (store != nullptr) {
    if (options.nvme_buffer_count < 1 || options.nvme_buffer_bytes < 1) {
      return absl::InvalidArgumentError(absl::StrCat("offloaded optimizer states of '", owner,
                                                     "': expected at least one NVMe buffer of at "
                                                     "least one byte, got ",
                                                     options.nvme_buffer_count, " of ",
                                                     options.nvme_buffer_bytes));
    }
    slice->store_ = store;
    slice->nvme_count_ = options.nvme_buffer_count;
    // Whole 4 KiB pages of each state per chunk, so every chunk starts
    // aligned for O_DIRECT.
    slice->chunk_ =
        std::max<int64_t>(1024, options.nvme_buffer_bytes / (4 * slice->states_) / 1024 * 1024);
    const int64_t last = slice->Chunks() - 1;
    MW_ASSIGN_OR_RETURN(slice->slot_,
                        store->AddSlot(slice->ChunkOffset(last) + slice->ChunkIoBytes(last)));
    return slice;
  }
  auto allocate = [&](const std::string& state, absl::string_view suffix = "") {
    return device.AllocatePinned(bytes, MemoryCategory::kOptimizerState,
                                 absl::StrCat(owner, ".", state, suffix));
  };
  const std::vector<std::string> names = StateNames(rule, momentum);
  MW_ASSIGN_OR_RETURN(slice->master_, allocate(names[0]));
  if (slice->states_ >= 2) {
    MW_ASSIGN_OR_RETURN(slice->first_, allocate(names[1]));
  }
  if (slice->states_ == 3) {
    MW_ASSIGN_OR_RETURN(slice->second_, allocate(names[2]));
  }
  if (speculative) {
    for (int i = 0; i < slice->states_; ++i) {
      MW_ASSIGN_OR_RETURN(slice->spare_[i], allocate(names[i], "_spare"));
    }
  }
  // Pinned memory is the CPU's: written directly.
  for (DeviceBuffer* b : {&slice->master_, &slice->first_, &slice->second_}) {
    if (b->data() != nullptr) std::memset(b->data(), 0, bytes);
  }
  return slice;
}

absl::StatusOr<std::pair<DeviceBuffer, char*>> HostOptimizerSlice::Aligned(
    int64_t bytes, absl::string_view suffix) {
  MW_ASSIGN_OR_RETURN(DeviceBuffer buffer, device_.AllocatePinned(bytes + NvmeStore::kAlignment,
                                                                  MemoryCategory::kWorkspace,
                                                                  absl::StrCat(owner_, suffix)));
  char* aligned = NvmeStore::AlignUp(buffer.data());
  return std::make_pair(std::move(buffer), aligned);
}

absl::Status HostOptimizerSlice::CheckStateRange(int which, int64_t begin, int64_t count) const {
  if (which < 0 || which >= states_ || begin < 0 || count < 0 || begin + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("optimizer state ", which, " of '", owner_,
                                              "': elements [", begin, ", ", begin + count,
                                              ") of ", states_, " x ", numel_));
  }
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::WriteState(int which, int64_t begin, int64_t count,
                                            const float* in) {
  MW_RETURN_IF_ERROR(CheckStateRange(which, begin, count));
  if (!device_.holds_bytes()) return absl::OkStatus();
  const size_t bytes = count * sizeof(float);
  if (store_ == nullptr) {
    DeviceBuffer* arrays[] = {&master_, &first_, &second_};
    std::memcpy(static_cast<float*>(arrays[which]->data()) + begin, in, bytes);
    return absl::OkStatus();
  }
  // Chunk by chunk through one buffer: read, change what is in range,
  // write to the spare copy; then sync and commit the whole copy.
  MW_ASSIGN_OR_RETURN(auto staging, Aligned(BufferBytes(), ".nvme_staging"));
  float* buffer = reinterpret_cast<float*>(staging.second);
  for (int64_t c = 0; c < Chunks(); ++c) {
    NvmeStore::Pending read = store_->ReadPart(slot_, ChunkOffset(c), ChunkIoBytes(c), buffer);
    MW_RETURN_IF_ERROR(store_->Wait(read));
    const int64_t c0 = c * chunk_, n = ChunkElements(c);
    const int64_t lo = std::max(begin, c0), hi = std::min(begin + count, c0 + n);
    if (lo < hi) std::memcpy(buffer + which * n + (lo - c0), in + (lo - begin), (hi - lo) * 4);
    NvmeStore::Pending write = store_->WritePart(slot_, ChunkOffset(c), ChunkIoBytes(c), buffer);
    MW_RETURN_IF_ERROR(store_->Wait(write));
  }
  MW_RETURN_IF_ERROR(store_->FinishWrite(slot_));
  return store_->Commit(slot_);
}

absl::Status HostOptimizerSlice::ReadState(int which, int64_t begin, int64_t count, float* out) {
  MW_RETURN_IF_ERROR(CheckStateRange(which, begin, count));
  if (!device_.holds_bytes()) return absl::OkStatus();
  const size_t bytes = count * sizeof(float);
  if (store_ == nullptr) {
    const DeviceBuffer* arrays[] = {&master_, &first_, &second_};
    std::memcpy(out, static_cast<const float*>(arrays[which]->data()) + begin, bytes);
    return absl::OkStatus();
  }
  MW_ASSIGN_OR_RETURN(auto staging, Aligned(BufferBytes(), ".nvme_staging"));
  const float* buffer = reinterpret_cast<const float*>(staging.second);
  for (int64_t c = begin / chunk_; count > 0 && c <= (begin + count - 1) / chunk_; ++c) {
    NvmeStore::Pending read =
        store_->ReadPart(slot_, ChunkOffset(c), ChunkIoBytes(c), staging.second);
    MW_RETURN_IF_ERROR(store_->Wait(read));
    const int64_t c0 = c * chunk_, n = ChunkElements(c);
    const int64_t lo = std::max(begin, c0), hi = std::min(begin + count, c0 + n);
    std::memcpy(out + (lo - begin), buffer + which * n + (lo - c0), (hi - lo) * 4);
  }
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::StageGradients(Stream& stream, const void* grads) {
  if (grad_slot_ >= 0) {
    // Streamed reductions only (AccumulateGradients): a slice whose
    // parameters are on NVMe has no gradient shard on the device.
    return absl::InternalError(
        absl::StrCat("gradients of '", owner_, "': staged whole, but they stream to NVMe"));
  }
  MW_RETURN_IF_ERROR(device_.CopyAsync(grads_.data(), grads, numel_ * DTypeSize(dtype_), stream));
  staged_ = true;
  return absl::OkStatus();
}

absl::StatusOr<char*> HostOptimizerSlice::Landing(int64_t begin, int64_t count,
                                                  bool earlier) {
  if (begin < 0 || count < 0 || begin + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("gradients of '", owner_, "': elements [", begin,
                                              ", ", begin + count, ") of ", numel_));
  }
  if (grad_slot_ < 0) return static_cast<char*>(grads_.data());
  // Gradients on NVMe: the reduction lands in a buffer of its own, which
  // holds the sum of the earlier micro-batches first.
  if (landing_.first.empty()) {
    MW_ASSIGN_OR_RETURN(landing_, Aligned(store_->rounded_bytes(grad_slot_), ".grad_landing"));
    if (earlier) MW_RETURN_IF_ERROR(store_->Read(grad_slot_, landing_.second));
  }
  return landing_.second;
}

absl::Status HostOptimizerSlice::AccumulateGradients(Stream& stream, const void* grads,
                                                     DType dtype, bool first, int64_t begin,
                                                     int64_t count) {
  MW_ASSIGN_OR_RETURN(char* base, Landing(begin, count, /*earlier=*/!first));
  MW_ASSIGN_OR_RETURN(DeviceBuffer incoming,
                      device_.AllocatePinned(count * DTypeSize(dtype), MemoryCategory::kWorkspace,
                                             absl::StrCat(owner_, ".grad_incoming")));
  MW_RETURN_IF_ERROR(device_.CopyAsync(incoming.data(), grads, count * DTypeSize(dtype), stream));
  MW_RETURN_IF_ERROR(stream.Synchronize());
  if (device_.holds_bytes()) {
    char* landing = base + begin * DTypeSize(dtype_);
    if (first) std::memset(landing, 0, count * DTypeSize(dtype_));  // +0 in every dtype
    kernels::cpu::Kernels().accumulate(incoming.data(), dtype, landing, dtype_, count);
  }
  staged_ = true;
  return Landed(count);
}

absl::StatusOr<const void*> HostOptimizerSlice::EarlierGradients(int64_t begin, int64_t count) {
  MW_ASSIGN_OR_RETURN(char* base, Landing(begin, count, /*earlier=*/true));
  if (!device_.holds_bytes()) return nullptr;
  return static_cast<const void*>(base + begin * DTypeSize(dtype_));
}

absl::Status HostOptimizerSlice::SkipGradients(int64_t begin, int64_t count) {
  if (device_.holds_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gradients of '", owner_, "': skipped on ", device_.name(),
        ", which holds values (only a dry run counts pieces unrun)"));
  }
  if (begin < 0 || count < 0 || begin + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("gradients of '", owner_, "': elements [", begin,
                                              ", ", begin + count, ") of ", numel_));
  }
  return Landed(count);
}

absl::Status HostOptimizerSlice::Landed(int64_t count) {
  if (grad_slot_ < 0) return absl::OkStatus();
  char* base = landing_.second;
  landed_ += count;
  if (landed_ < numel_) return absl::OkStatus();
  // Complete: scanned now (the step's check reads the last one), written
  // out, and the buffer goes. Unsynced: the update reads them back within
  // the step, and the sync that ends the step's update reports a write
  // the disk failed later.
  if (device_.holds_bytes()) {
    const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
    landed_scan_.nonfinite = cpu.has_inf_or_nan(base, dtype_, numel_);
    landed_scan_.squares = cpu.sum_of_squares(base, dtype_, numel_);
  }
  MW_RETURN_IF_ERROR(store_->WriteUnsynced(grad_slot_, base));
  landing_ = {};
  landed_ = 0;
  return absl::OkStatus();
}

kernels::GradientScan::Result HostOptimizerSlice::ScanGradients(bool nonfinite,
                                                                bool squares) const {
  kernels::GradientScan::Result r;
  if (!device_.holds_bytes()) return r;
  if (grad_slot_ >= 0) {
    r.nonfinite = nonfinite && landed_scan_.nonfinite;
    r.squares = squares ? landed_scan_.squares : 0.0;
    return r;
  }
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  if (nonfinite) r.nonfinite = cpu.has_inf_or_nan(grads_.data(), dtype_, numel_);
  if (squares) r.squares = cpu.sum_of_squares(grads_.data(), dtype_, numel_);
  return r;
}

int64_t HostOptimizerSlice::grad_buffer_bytes() const {
  return grad_slot_ < 0 ? 0 : store_->rounded_bytes(grad_slot_) + NvmeStore::kAlignment;
}

int64_t HostOptimizerSlice::scratch_bytes() const { return numel_ * DTypeSize(dtype_); }

int HostOptimizerSlice::nvme_buffer_count() const {
  return store_ == nullptr ? 0 : static_cast<int>(std::min<int64_t>(nvme_count_, Chunks()));
}

absl::Status HostOptimizerSlice::Update(Stream& stream, const UpdateArgs& args) {
  void* const scratch = args.scratch;
  if (!staged_) {
    return absl::FailedPreconditionError(
        absl::StrCat("offloaded optimizer states of '", owner_, "': no gradients staged"));
  }
  MW_RETURN_IF_ERROR(Validate(rule_, args.segments));
  // The staged gradients stay staged until Commit: a failed update (an NVMe
  // write) can be retried from them.
  const bool wide = dtype_ == DType::kF32;
  // Scratch: the refreshed parameters.
  char* params = static_cast<char*>(scratch);
  pending_ = params;
  // NVMe: the committed state streams in through bounded buffers (the
  // caller's stream, or buffers of this update's own); the new one goes to
  // the spare copy.
  std::pair<DeviceBuffer, char*> buffers;
  if (store_ != nullptr && args.nvme_stream == nullptr) {
    MW_ASSIGN_OR_RETURN(buffers, Aligned(nvme_buffer_count() * BufferBytes(), ".nvme_buffers"));
  }
  MW_RETURN_IF_ERROR(stream.Synchronize());  // the staged gradients have landed
  // Gradients on NVMe: read back whole (on meta the store counts it).
  void* staged = grads_.data();
  if (grad_slot_ >= 0) {
    if (args.grad_buffer == nullptr && device_.holds_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("offloaded optimizer states of '", owner_,
                                                     "': gradients on NVMe need a grad_buffer"));
    }
    staged = args.grad_buffer;
    MW_RETURN_IF_ERROR(store_->Read(grad_slot_, staged));
  }
  // The kernels read the gradients in the parameter dtype, widening each.
  const char* g = static_cast<const char*>(staged);
  if (store_ != nullptr) {
    if (args.nvme_stream != nullptr) {
      return UpdateFromNvme(args.segments, g, params, *args.nvme_stream);
    }
    NvmeChunkStream own(*store_, buffers.second, nvme_buffer_count(), BufferBytes());
    QueueChunks(own);
    MW_RETURN_IF_ERROR(UpdateFromNvme(args.segments, g, params, own));
    return own.Finish();
  }
  if (!device_.holds_bytes()) return absl::OkStatus();  // meta: accounting only
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  float *master, *first, *second;
  if (speculative_) {
    // The new state goes to the spare copy, the current one stays (Adam
    // out of place; SGD copies each chunk over and updates it in cache).
    master = static_cast<float*>(spare_[0].data());
    first = static_cast<float*>(spare_[1].data());
    second = static_cast<float*>(spare_[2].data());
  } else {
    master = static_cast<float*>(master_.data());
    first = static_cast<float*>(first_.data());
    second = static_cast<float*>(second_.data());
  }
  // Element-wise kernels: the chunks change nothing in the results.
  const bool copy = speculative_ && rule_ == Rule::kSgd;
  const int64_t chunk = copy ? kSpeculativeChunk : numel_;
  const auto current = [&](int k) {
    const DeviceBuffer* arrays[] = {&master_, &first_, &second_};
    return static_cast<const float*>(arrays[k]->data());
  };
  for (const Segment& s : args.segments) {
    for (int64_t i = s.begin; i < s.begin + s.count; i += chunk) {
      const int64_t n = std::min(chunk, s.begin + s.count - i);
      char* low = wide ? nullptr : params + i * DTypeSize(dtype_);
      float* m = first == nullptr ? nullptr : first + i;
      if (rule_ == Rule::kAdam && speculative_) {
        kernels::cpu::ParallelAdamTo(cpu, kernels::MakeAdamConstants(s.adam), current(0) + i,
                                     g + i * DTypeSize(dtype_), dtype_, current(1) + i,
                                     current(2) + i, master + i, m, second + i, low, dtype_, n,
                                     threads_);
        continue;
      }
      for (int k = 0; copy && k < states_; ++k) {
        std::memcpy(static_cast<float*>(spare_[k].data()) + i, current(k) + i, n * sizeof(float));
      }
      Apply(s, i, n, master + i, g, m, second == nullptr ? nullptr : second + i, params);
    }
  }
  if (wide) std::memcpy(params, master, numel_ * sizeof(float));
  return absl::OkStatus();
}

int64_t HostOptimizerSlice::ChunkIoBytes(int64_t c) const {
  const int64_t a = NvmeStore::kAlignment;
  return (states_ * ChunkElements(c) * 4 + a - 1) / a * a;
}

void HostOptimizerSlice::Apply(const Segment& s, int64_t i, int64_t n, float* master, const char* g,
                               float* m, float* v, char* params) const {
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  const size_t size = DTypeSize(dtype_);
  char* low = dtype_ == DType::kF32 ? nullptr : params + i * size;
  if (rule_ == Rule::kAdam) {
    kernels::cpu::ParallelAdam(cpu, kernels::MakeAdamConstants(s.adam), master, g + i * size,
                               dtype_, m, v, low, dtype_, n, threads_);
  } else {
    // A param_group without momentum keeps no buffer (torch's SGD).
    cpu.sgd(s.sgd, master, g + i * size, dtype_, s.sgd.momentum > 0.0f ? m : nullptr, low,
            dtype_, n);
  }
}

void HostOptimizerSlice::QueueChunks(NvmeChunkStream& stream) const {
  for (int64_t c = 0; c < Chunks(); ++c) stream.Add(slot_, ChunkOffset(c), ChunkIoBytes(c));
}

absl::Status HostOptimizerSlice::UpdateFromNvme(absl::Span<const Segment> segments, const char* g,
                                                char* params, NvmeChunkStream& stream) {
  for (int64_t c = 0; c < Chunks(); ++c) {
    if (stream.next_slot() != slot_) {
      return absl::FailedPreconditionError(absl::StrCat("offloaded optimizer states of '", owner_,
                                                        "': chunk ", c, " of ", Chunks(),
                                                        " is not next in the NVMe chunk stream"));
    }
    MW_ASSIGN_OR_RETURN(char* buffer, stream.Next());
    if (device_.holds_bytes()) {
      const int64_t c0 = c * chunk_, n = ChunkElements(c);
      // The chunk holds its master weights, then each moment, n apiece.
      float* master = reinterpret_cast<float*>(buffer);
      float* m = states_ >= 2 ? master + n : nullptr;
      float* v = states_ == 3 ? master + 2 * n : nullptr;
      for (const Segment& s : segments) {
        const int64_t lo = std::max(s.begin, c0), hi = std::min(s.begin + s.count, c0 + n);
        if (lo >= hi) continue;
        Apply(s, lo, hi - lo, master + (lo - c0), g, m == nullptr ? nullptr : m + (lo - c0),
              v == nullptr ? nullptr : v + (lo - c0), params);
      }
      if (dtype_ == DType::kF32) std::memcpy(params + c0 * 4, master, n * 4);
    }
    stream.Write();
  }
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::Commit(Stream& stream, void* params) {
  if (pending_ == nullptr && device_.holds_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat("offloaded optimizer states of '", owner_, "': no update to commit"));
  }
  if (store_ != nullptr && device_.holds_bytes()) MW_RETURN_IF_ERROR(store_->Commit(slot_));
  if (speculative_) {
    DeviceBuffer* current[] = {&master_, &first_, &second_};
    for (int i = 0; i < states_; ++i) std::swap(*current[i], spare_[i]);
  }
  if (params != nullptr) {
    MW_RETURN_IF_ERROR(device_.CopyAsync(params, pending_, numel_ * DTypeSize(dtype_), stream));
  }
  MW_RETURN_IF_ERROR(stream.Synchronize());
  pending_ = nullptr;
  staged_ = false;
  return absl::OkStatus();
}

}  // namespace memwall
