#include "cli/demo.h"

#include <mpi.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "runtime/communicator.h"
#include "runtime/mpi_communicator.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// Every rank's gradient is a known function of (rank, index), so each rank
// can check the reduced, updated and gathered parameters on its own.
// Gradients are multiples of 2^-10 below 2^-4, so their f32 sum is exact in
// any order MPI chooses (for any rank count this machine can run).
float Gradient(int rank, int64_t i) { return float((i * 7 + rank * 13) % 101 - 50) / 1024.0f; }
float InitialWeight(int64_t i) { return 0.01f * float(i % 199 - 99); }

std::string Row(absl::string_view name, const std::vector<int64_t>& per_rank) {
  std::string row = absl::StrFormat("  %-24s", name);
  for (int64_t bytes : per_rank) absl::StrAppendFormat(&row, " %12s", FormatBytes(bytes));
  return row;
}

}  // namespace

absl::Status RunDemo(const DemoOptions& options) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> world, MpiCommunicator::Create());
  const int rank = world->rank(), ranks = world->world_size();
  const bool meta = options.backend == Backend::kMeta;
  if (options.backend == Backend::kCuda) {
    return absl::UnimplementedError(
        "demo: the cuda backend joins the demo with the training engine; use host or meta");
  }
  // On meta no bytes exist to exchange: the collectives are simulated (and
  // counted) for this rank of the MPI world.
  std::unique_ptr<Communicator> simulated;
  if (meta) {
    MW_ASSIGN_OR_RETURN(simulated, SimulatedCommunicator::Create(rank, ranks));
  }
  Communicator& comm = meta ? *simulated : static_cast<Communicator&>(*world);

  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      CreateDevice({options.backend, rank, options.capacity_bytes}));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream());
  const int64_t shard = (options.parameters + ranks - 1) / ranks;
  const int64_t padded = shard * ranks;
  const int64_t begin = rank * shard;

  // Full bf16 parameters and f32 gradients (what every rank holds in ZeRO
  // stage 1), then the rank's shard of f32 master weights and Adam moments.
  MW_ASSIGN_OR_RETURN(DeviceBuffer params,
                      device->Allocate(padded * 2, MemoryCategory::kParameter, "toy.weight"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer grads,
                      device->Allocate(padded * 4, MemoryCategory::kGradient, "toy.weight.grad"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer grad_shard,
                      device->Allocate(shard * 4, MemoryCategory::kGradient, "toy.weight.grad_shard"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer master, device->Allocate(shard * 4, MemoryCategory::kOptimizerState,
                                                            "toy.weight.master"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer exp_avg, device->Allocate(shard * 4, MemoryCategory::kOptimizerState,
                                                             "toy.weight.exp_avg"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer exp_avg_sq, device->Allocate(shard * 4, MemoryCategory::kOptimizerState,
                                                                "toy.weight.exp_avg_sq"));
  MW_ASSIGN_OR_RETURN(DeviceBuffer send_shard, device->Allocate(shard * 2, MemoryCategory::kCommBuffer,
                                                                "toy.allgather.send"));

  if (!meta) {
    auto* g = static_cast<float*>(grads.data());
    auto* p = static_cast<float*>(master.data());
    for (int64_t i = 0; i < padded; ++i) g[i] = i < options.parameters ? Gradient(rank, i) : 0.0f;
    for (int64_t j = 0; j < shard; ++j) p[j] = InitialWeight(begin + j);
  }
  MW_RETURN_IF_ERROR(kernels::Fill(*device, *stream, exp_avg.data(), DType::kF32, shard, 0.0f));
  MW_RETURN_IF_ERROR(kernels::Fill(*device, *stream, exp_avg_sq.data(), DType::kF32, shard, 0.0f));

  // The step: reduce-scatter gradients (mean), Adam on the shard writing the
  // bf16 copy, all-gather the bf16 parameters.
  MW_RETURN_IF_ERROR(comm.ReduceScatter(grads.data(), grad_shard.data(), shard, DType::kF32,
                                        ReduceOp::kSum, *stream));
  MW_RETURN_IF_ERROR(kernels::Scale(*device, *stream, grad_shard.data(), DType::kF32, shard,
                                    1.0f / ranks));
  kernels::AdamParams adam;
  adam.lr = 1e-2f;
  MW_RETURN_IF_ERROR(kernels::AdamUpdate(
      *device, *stream, adam, static_cast<float*>(master.data()), grad_shard.data(), DType::kF32,
      static_cast<float*>(exp_avg.data()), static_cast<float*>(exp_avg_sq.data()),
      send_shard.data(), DType::kBF16, shard));
  MW_RETURN_IF_ERROR(comm.AllGather(send_shard.data(), params.data(), shard, DType::kBF16, *stream));
  MW_RETURN_IF_ERROR(stream->Synchronize());

  // Check every gathered parameter against the update computed here alone.
  int64_t mismatches = 0;
  if (!meta) {
    const kernels::AdamConstants c = kernels::MakeAdamConstants(adam);
    const auto* gathered = static_cast<const uint16_t*>(params.data());
    for (int64_t i = 0; i < options.parameters; ++i) {
      float sum = 0.0f;
      for (int q = 0; q < ranks; ++q) sum += Gradient(q, i);
      float w = InitialWeight(i), m = 0.0f, v = 0.0f;
      kernels::AdamElement(c, w, sum * (1.0f / ranks), m, v);
      if (gathered[i] != F32ToBf16(w)) ++mismatches;
    }
  }

  // Gather every rank's books to rank 0.
  const AllocatorStats s = device->allocator().stats();
  std::vector<int64_t> mine;
  for (MemoryCategory c : kAllMemoryCategories) mine.push_back(s.by_category[int(c)].peak);
  mine.push_back(s.requested.peak);
  mine.push_back(s.reserved.peak);
  mine.push_back(comm.stats(Collective::kReduceScatter).bytes);
  mine.push_back(comm.stats(Collective::kAllGather).bytes);
  mine.push_back(mismatches);
  // A gather as a sum: every rank fills its own row of zeros.
  std::vector<int64_t> all(mine.size() * ranks, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + rank * mine.size());
  MW_RETURN_IF_ERROR(
      world->AllReduceHost(all.data(), int(all.size()), MPI_INT64_T, MPI_SUM, "the books"));
  if (rank != 0) return absl::OkStatus();

  auto column = [&](size_t field) {
    std::vector<int64_t> out(ranks);
    for (int q = 0; q < ranks; ++q) out[q] = all[q * mine.size() + field];
    return out;
  };
  const size_t n = kAllMemoryCategories.size();
  int64_t total_mismatches = 0;
  for (int64_t x : column(n + 4)) total_mismatches += x;
  std::printf("memwall demo: %d rank%s, %s backend with %s per rank, %lld parameters (%lld per shard)\n",
              ranks, ranks == 1 ? "" : "s", std::string(BackendName(options.backend)).c_str(),
              FormatBytes(options.capacity_bytes).c_str(),
              static_cast<long long>(options.parameters), static_cast<long long>(shard));
  std::printf("step: f32 gradients reduce-scattered, Adam on each rank's shard (CPU kernels: %s), "
              "bf16 parameters all-gathered\n",
              meta ? "none on meta" : kernels::cpu::IsaName(kernels::cpu::SelectedIsa()));
  if (meta) {
    std::printf("check: skipped on meta (no bytes exist; sizes and traffic are real)\n");
  } else {
    std::printf("check: %lld of %lld gathered parameters differ from the single-process update on "
                "some rank\n",
                static_cast<long long>(total_mismatches), static_cast<long long>(options.parameters));
  }
  std::printf("\npeak device memory by category (requested bytes, from memwall's allocator)\n");
  std::string header = absl::StrFormat("  %-24s", "category");
  for (int q = 0; q < ranks; ++q) absl::StrAppendFormat(&header, " %12s", absl::StrCat("rank ", q));
  std::printf("%s\n", header.c_str());
  for (size_t c = 0; c < n; ++c) {
    const std::vector<int64_t> values = column(c);
    bool any = false;
    for (int64_t v : values) any = any || v != 0;
    if (any) std::printf("%s\n", Row(MemoryCategoryName(kAllMemoryCategories[c]), values).c_str());
  }
  std::printf("%s\n", Row("peak (all categories)", column(n)).c_str());
  std::printf("%s\n", Row("peak reserved", column(n + 1)).c_str());
  std::printf("\ncommunication per rank: ReduceScatter %s, AllGather %s\n",
              FormatBytes(column(n + 2)[0]).c_str(), FormatBytes(column(n + 3)[0]).c_str());
  if (total_mismatches != 0) {
    return absl::InternalError(absl::StrCat("demo: ", total_mismatches,
                                            " gathered parameters differ from the reference"));
  }
  return absl::OkStatus();
}

}  // namespace memwall
