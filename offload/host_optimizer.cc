#include "offload/host_optimizer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<HostOptimizerSlice>> HostOptimizerSlice::Create(
    Device& device, Rule rule, bool momentum, DType param_dtype, int64_t numel,
    absl::string_view owner, NvmeStore* store, bool speculative, int threads) {
  if (device.pinned_allocator() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "offloaded optimizer states of '", owner, "': ", device.name(),
        " has no pinned pool (DeviceOptions::pinned_capacity_bytes)"));
  }
  if (speculative && store != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offloaded optimizer states of '", owner,
        "': a speculative slice keeps its spare copy in pinned memory, not on NVMe"));
  }
  std::unique_ptr<HostOptimizerSlice> slice(new HostOptimizerSlice(
      device, rule, momentum, param_dtype, numel, std::string(owner), speculative,
      threads > 0 ? threads : kernels::cpu::CpuThreads()));
  MW_ASSIGN_OR_RETURN(slice->grads_,
                      device.AllocatePinned(numel * DTypeSize(param_dtype),
                                            MemoryCategory::kGradient,
                                            absl::StrCat(owner, ".grad_host")));
  const size_t bytes = numel * sizeof(float);
  if (store != nullptr) {
    slice->store_ = store;
    MW_ASSIGN_OR_RETURN(slice->slot_, store->AddSlot(slice->states_ * bytes));
    return slice;
  }
  auto allocate = [&](const char* suffix) {
    return device.AllocatePinned(bytes, MemoryCategory::kOptimizerState,
                                 absl::StrCat(owner, suffix));
  };
  MW_ASSIGN_OR_RETURN(slice->master_, allocate(".master"));
  if (slice->states_ >= 2) {
    MW_ASSIGN_OR_RETURN(slice->first_, allocate(rule == Rule::kAdam ? ".exp_avg" : ".momentum"));
  }
  if (slice->states_ == 3) {
    MW_ASSIGN_OR_RETURN(slice->second_, allocate(".exp_avg_sq"));
  }
  if (speculative) {
    const char* spare[] = {".master_spare", rule == Rule::kAdam ? ".exp_avg_spare" : ".momentum_spare",
                           ".exp_avg_sq_spare"};
    for (int i = 0; i < slice->states_; ++i) {
      MW_ASSIGN_OR_RETURN(slice->spare_[i], allocate(spare[i]));
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
  MW_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                      device_.AllocatePinned(bytes + NvmeStore::kAlignment,
                                             MemoryCategory::kWorkspace,
                                             absl::StrCat(owner_, suffix)));
  const uintptr_t at = reinterpret_cast<uintptr_t>(buffer.data());
  const uintptr_t aligned = (at + NvmeStore::kAlignment - 1) / NvmeStore::kAlignment *
                            NvmeStore::kAlignment;
  return std::make_pair(std::move(buffer), reinterpret_cast<char*>(aligned));
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
  // The slot holds master, then the moments: read, change, write, commit.
  MW_ASSIGN_OR_RETURN(auto staging, Aligned(store_->slot_bytes(slot_), ".nvme_staging"));
  MW_RETURN_IF_ERROR(store_->Read(slot_, staging.second));
  std::memcpy(reinterpret_cast<float*>(staging.second) + which * numel_ + begin, in, bytes);
  MW_RETURN_IF_ERROR(store_->Write(slot_, staging.second));
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
  MW_ASSIGN_OR_RETURN(auto staging, Aligned(store_->slot_bytes(slot_), ".nvme_staging"));
  MW_RETURN_IF_ERROR(store_->Read(slot_, staging.second));
  std::memcpy(out, reinterpret_cast<const float*>(staging.second) + which * numel_ + begin, bytes);
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::StageGradients(Stream& stream, const void* grads) {
  MW_RETURN_IF_ERROR(device_.CopyAsync(grads_.data(), grads, numel_ * DTypeSize(dtype_), stream));
  staged_ = true;
  return absl::OkStatus();
}

absl::Status HostOptimizerSlice::AccumulateGradients(Stream& stream, const void* grads,
                                                     DType dtype, bool first, int64_t begin,
                                                     int64_t count) {
  if (begin < 0 || count < 0 || begin + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("gradients of '", owner_, "': elements [", begin,
                                              ", ", begin + count, ") of ", numel_));
  }
  MW_ASSIGN_OR_RETURN(DeviceBuffer incoming,
                      device_.AllocatePinned(count * DTypeSize(dtype), MemoryCategory::kWorkspace,
                                             absl::StrCat(owner_, ".grad_incoming")));
  MW_RETURN_IF_ERROR(device_.CopyAsync(incoming.data(), grads, count * DTypeSize(dtype), stream));
  MW_RETURN_IF_ERROR(stream.Synchronize());
  if (device_.holds_bytes()) {
    char* landing = static_cast<char*>(grads_.data()) + begin * DTypeSize(dtype_);
    if (first) std::memset(landing, 0, count * DTypeSize(dtype_));  // +0 in every dtype
    kernels::cpu::Kernels().accumulate(incoming.data(), dtype, landing, dtype_, count);
  }
  staged_ = true;
  return absl::OkStatus();
}

int64_t HostOptimizerSlice::scratch_bytes() const {
  return params_bytes() + (dtype_ == DType::kF32 ? 0 : numel_ * 4);
}

int64_t HostOptimizerSlice::params_bytes() const { return numel_ * DTypeSize(dtype_); }

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
  // Scratch: the refreshed parameters, then (16-bit) the f32 gradients.
  char* params = static_cast<char*>(scratch);
  float* grads32 = wide || scratch == nullptr ? nullptr
                   : args.widened != nullptr  ? args.widened
                                              : reinterpret_cast<float*>(params + params_bytes());
  pending_ = params;
  // NVMe: the committed state comes in; the new one goes to the spare copy.
  std::pair<DeviceBuffer, char*> state;
  if (store_ != nullptr) {
    MW_ASSIGN_OR_RETURN(state, Aligned(store_->slot_bytes(slot_), ".nvme_staging"));
  }
  MW_RETURN_IF_ERROR(stream.Synchronize());  // the staged gradients have landed
  if (!device_.holds_bytes()) return absl::OkStatus();  // meta: accounting only
  float *master, *first, *second;
  if (store_ != nullptr) {
    MW_RETURN_IF_ERROR(store_->Read(slot_, state.second));
    auto* base = reinterpret_cast<float*>(state.second);
    master = base;
    first = states_ >= 2 ? base + numel_ : nullptr;
    second = states_ == 3 ? base + 2 * numel_ : nullptr;
  } else if (speculative_) {
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
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  float* g = static_cast<float*>(grads_.data());
  if (!wide) {
    cpu.cast(grads_.data(), dtype_, grads32, DType::kF32, numel_);
    g = grads32;
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
                                     g + i, current(1) + i, current(2) + i, master + i, m,
                                     second + i, low, dtype_, n, threads_);
      } else if (rule_ == Rule::kAdam) {
        kernels::cpu::ParallelAdam(cpu, kernels::MakeAdamConstants(s.adam), master + i, g + i, m,
                                   second + i, low, dtype_, n, threads_);
      } else {
        for (int k = 0; copy && k < states_; ++k) {
          std::memcpy(static_cast<float*>(spare_[k].data()) + i, current(k) + i,
                      n * sizeof(float));
        }
        cpu.sgd(s.sgd, master + i, g + i, m, low, dtype_, n);
      }
    }
  }
  if (wide) std::memcpy(params, master, numel_ * sizeof(float));
  if (store_ != nullptr) MW_RETURN_IF_ERROR(store_->Write(slot_, state.second));
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
  MW_RETURN_IF_ERROR(device_.CopyAsync(params, pending_, numel_ * DTypeSize(dtype_), stream));
  MW_RETURN_IF_ERROR(stream.Synchronize());
  pending_ = nullptr;
  staged_ = false;
  return absl::OkStatus();
}

}  // namespace memwall
