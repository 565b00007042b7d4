#include "sharding/param_pages.h"

#include <algorithm>
#include <utility>

#include "kernels/cpu/cpu_kernels.h"
#include "runtime/status.h"

namespace memwall {

absl::Status ParamPages::AllocatePages(int count, int64_t shard_bytes) {
  stride_ = NvmeStore::RoundUp(shard_bytes);
  MW_ASSIGN_OR_RETURN(pages_, device_.AllocatePinned(count * stride_ + NvmeStore::kAlignment,
                                                     MemoryCategory::kWorkspace,
                                                     "optimizer.param_pages"));
  copied_.resize(count);
  reads_.assign(count, PageRead{});
  for (std::unique_ptr<Event>& event : copied_) {
    MW_ASSIGN_OR_RETURN(event, device_.CreateEvent());
  }
  return absl::OkStatus();
}

absl::StatusOr<ParamPages::Page> ParamPages::Take() {
  const int n = static_cast<int>(copied_.size());
  for (int k = 0; k < n; ++k) {
    const int i = (next_ + k) % n;
    if (reads_[i].group >= 0) continue;  // a read ahead lands there
    next_ = (i + 1) % n;
    // The page's last copy out (to a gathered buffer) has run.
    MW_RETURN_IF_ERROR(copied_[i]->Synchronize());
    return At(i);
  }
  // ReadAhead leaves one page free.
  return absl::InternalError("ParamPages: every page buffer holds a read ahead");
}

ParamPages::Page ParamPages::At(int i) {
  return Page{NvmeStore::AlignUp(pages_.data()) + i * stride_, copied_[i].get(), i};
}

int ParamPages::ReadAheadPage(int g) const {
  for (size_t p = 0; p < reads_.size(); ++p) {
    if (reads_[p].group == g) return static_cast<int>(p);
  }
  return -1;
}

absl::StatusOr<ParamPages::Page> ParamPages::ReadForGather(int g, int slot) {
  if (const int p = ReadAheadPage(g); p >= 0) {  // its page is this copy's
    reads_[p].group = -1;
    MW_RETURN_IF_ERROR(store_->Wait(reads_[p].read));
    return At(p);
  }
  MW_ASSIGN_OR_RETURN(const Page page, Take());
  MW_RETURN_IF_ERROR(store_->Read(slot, page.data));
  return page;
}

absl::Status ParamPages::ReadAhead(int g, int slot) {
  if (ReadAheadPage(g) >= 0) return absl::OkStatus();
  const int held = static_cast<int>(std::count_if(reads_.begin(), reads_.end(),
                                                  [](const PageRead& r) { return r.group >= 0; }));
  if (held + 1 >= static_cast<int>(reads_.size())) return absl::OkStatus();
  MW_ASSIGN_OR_RETURN(const Page page, Take());
  reads_[page.index] = {g, store_->ReadPart(slot, 0, store_->rounded_bytes(slot), page.data)};
  return absl::OkStatus();
}

void ParamPages::DropReadAheads() {
  for (PageRead& r : reads_) {
    if (r.group < 0) continue;
    // Its data is not needed; a failing disk fails the next read that is.
    (void)store_->Wait(r.read);
    r.group = -1;
  }
}

absl::Status ParamPages::WriteFromF32(int slot, const float* from, int64_t count, DType dtype) {
  MW_ASSIGN_OR_RETURN(const Page page, Take());
  if (device_.holds_bytes()) {
    kernels::cpu::Kernels().cast(from, DType::kF32, page.data, dtype, count);
  }
  // On meta the store is virtual: it counts the bytes.
  MW_RETURN_IF_ERROR(store_->Write(slot, page.data));
  return store_->Commit(slot);
}

}  // namespace memwall
