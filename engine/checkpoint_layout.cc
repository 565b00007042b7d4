#include "engine/checkpoint_layout.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status.h"

namespace memwall {

namespace fs = std::filesystem;

std::string StepDir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("step-%08d", step)).string();
}

std::vector<StepDirectory> StepDirs(const std::string& dir) {
  std::vector<StepDirectory> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    if (!e.is_directory() || !absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(name.substr(5), &step)) {
      continue;
    }
    found.push_back({step, e.path().string(), fs::exists(e.path() / kManifest)});
  }
  std::sort(found.begin(), found.end(),
            [](const StepDirectory& a, const StepDirectory& b) { return a.step < b.step; });
  return found;
}

// The 64-bit values travel as pairs of f32 slots of an all-gather (a copy).
absl::StatusOr<std::vector<int64_t>> AllGatherInts(ShardedOptimizer& opt,
                                                   const std::vector<int64_t>& mine) {
  Communicator& comm = opt.communicator();
  Device& device = opt.device();
  const size_t n = mine.size(), world = comm.world_size();
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  MW_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                      device.Allocate(n * 8 * world, MemoryCategory::kCommBuffer,
                                      "checkpoint.exchange"));
  char* own = static_cast<char*>(buffer.data()) + n * 8 * comm.rank();
  MW_RETURN_IF_ERROR(device.CopyAsync(own, mine.data(), n * 8, *stream));
  MW_RETURN_IF_ERROR(comm.AllGather(own, buffer.data(), 2 * n, DType::kF32, *stream));
  std::vector<int64_t> all(n * world);
  MW_RETURN_IF_ERROR(device.CopyAsync(all.data(), buffer.data(), n * 8 * world, *stream));
  MW_RETURN_IF_ERROR(stream->Synchronize());
  return all;
}

absl::Status RankZeroStatus(ShardedOptimizer& opt, const absl::Status& mine,
                            const std::string& path, const char* what) {
  MW_ASSIGN_OR_RETURN(const std::vector<int64_t> codes,
                      AllGatherInts(opt, {static_cast<int64_t>(mine.code())}));
  MW_RETURN_IF_ERROR(mine);
  if (codes[0] == 0) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(codes[0]);
  return absl::Status(code, absl::StrCat("checkpoint ", path, ": rank 0 could not ", what, " (",
                                         absl::StatusCodeToString(code),
                                         ", named in that rank's error)"));
}

}  // namespace memwall
