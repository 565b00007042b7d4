// ParamResidence: each group's parameters in device memory, the pinned
// pool or an NVMe file (past offload_param.max_in_cpu), written rounded to
// the parameter dtype wherever they live, and the step's two-phase update
// of shards on NVMe; on the host backend with a real file.
#include "sharding/param_residence.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/units.h"
#include "tests/support/test_files.h"

namespace memwall {
namespace {

using Place = ParamResidence::Place;
using testing::TestDirectory;

// Three explicit groups of 1000 elements (padded to 1024, the alignment).
constexpr int64_t kNumel = 1000;
constexpr int64_t kPadded = 1024;

FlatLayout Layout() {
  std::vector<ParameterSpec> specs;
  for (const char* g : {"a", "b", "c"}) specs.push_back({std::string(g) + ".w", {kNumel}, g, true});
  return BuildFlatLayout(specs, /*world_size=*/1, /*bucket_elements=*/1, /*alignment=*/128).value();
}

// Not representable in bf16: each write rounds them.
std::vector<float> Values(int seed) {
  std::vector<float> v(kPadded);
  for (int64_t i = 0; i < kPadded; ++i) v[i] = 1.0f + (i + seed) * (1.0f / 4096) + 1e-6f;
  return v;
}

bool HoldsRounded(const void* at, const std::vector<float>& values) {
  const auto* bits = static_cast<const uint16_t*>(at);
  for (int64_t i = 0; i < kPadded; ++i) {
    if (bits[i] != F32ToBf16(values[i])) return false;
  }
  return true;
}

struct Fixture {
  ShardingOptions config;
  FlatLayout layout = Layout();
  std::unique_ptr<Device> device = CreateDevice({Backend::kHost, 0, 16 * kMiB, 16 * kMiB}).value();
  std::unique_ptr<Stream> stream = device->CreateStream().value();

  Fixture(bool offload, bool nvme, int64_t max_in_cpu = kPadded) {
    config.bf16 = true;
    config.zero.stage = 3;
    config.zero.offload_param = offload;
    config.zero.offload_param_max_in_cpu = max_in_cpu;
    config.zero.offload_param_buffer_count = 2;
    config.zero.offload_param_buffer_size = kPadded;
    if (nvme) config.zero.offload_param_nvme_path = TestDirectory();
  }
  absl::StatusOr<std::unique_ptr<ParamResidence>> Make() {
    std::unique_ptr<NvmeStore> store;
    if (!config.zero.offload_param_nvme_path.empty()) {
      store = NvmeStore::Open(TestDirectory(), "param_residence_test.bin").value();
    }
    return ParamResidence::Create(config, layout, *device, std::move(store));
  }
};

TEST_CASE("parameters live on the device, in the pinned pool, or past max_in_cpu on NVMe") {
  {
    Fixture f(/*offload=*/false, /*nvme=*/false);
    auto r = f.Make().value();
    for (int g = 0; g < 3; ++g) {
      CHECK(r->place(g) == Place::kDevice);
      REQUIRE(r->Allocate(g).ok());
    }
    CHECK(r->pages() == nullptr);
    // Each group's shard (the whole group on one rank), bf16, as parameters.
    CHECK(f.device->allocator().stats().by_category[int(MemoryCategory::kParameter)].current ==
          3 * kPadded * 2);
  }
  {
    Fixture f(/*offload=*/true, /*nvme=*/false);
    auto r = f.Make().value();
    for (int g = 0; g < 3; ++g) {
      CHECK(r->place(g) == Place::kPinned);
      REQUIRE(r->Allocate(g).ok());
    }
    CHECK(f.device->allocator().stats().by_category[int(MemoryCategory::kParameter)].current == 0);
    CHECK(f.device->pinned_allocator()->stats().by_category[int(MemoryCategory::kParameter)].current ==
          3 * kPadded * 2);
  }
  {
    // One shard fits max_in_cpu; the next would not, so it and every one
    // after it go to the file.
    Fixture f(/*offload=*/true, /*nvme=*/true, /*max_in_cpu=*/kPadded + 1);
    auto r = f.Make().value();
    CHECK(r->place(0) == Place::kPinned);
    CHECK(r->place(1) == Place::kNvme);
    CHECK(r->place(2) == Place::kNvme);
    for (int g = 0; g < 3; ++g) REQUIRE(r->Allocate(g).ok());
    REQUIRE(r->AllocatePages().ok());
    CHECK(r->data(1) == nullptr);
    CHECK(r->shard(1).slot >= 0);
    CHECK(r->shard(0).slot == -1);
    // Two page buffers of one 2048-byte shard rounded to a 4 KiB block,
    // and a block to align them.
    CHECK(f.device->pinned_allocator()->stats().by_category[int(MemoryCategory::kWorkspace)].current ==
          3 * 4096);
    CHECK(r->update_bytes(1) == 4096);
    CHECK(r->update_bytes(0) == 0);
  }
}

TEST_CASE("a shard larger than a page buffer is refused by name") {
  Fixture f(/*offload=*/true, /*nvme=*/true, /*max_in_cpu=*/0);
  f.config.zero.offload_param_buffer_size = 1000;
  const absl::Status refused = f.Make().status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()) ==
        "zero_optimization.offload_param.buffer_size: expected at least 1024 (elements of the "
        "largest parameter shard on NVMe, one page buffer each), got 1000");
}

TEST_CASE("a write rounds f32 values to the parameter dtype wherever the group lives") {
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    Fixture f(offload, /*nvme=*/offload, /*max_in_cpu=*/kPadded);
    auto r = f.Make().value();
    for (int g = 0; g < 3; ++g) REQUIRE(r->Allocate(g).ok());
    REQUIRE(r->AllocatePages().ok());
    for (int g = 0; g < 3; ++g) {
      REQUIRE(r->Write(g, Values(g).data(), *f.stream, "test.init").ok());
    }
    for (int g = 0; g < 3; ++g) {
      CAPTURE(g);
      if (r->place(g) == Place::kNvme) {
        auto page = r->pages()->ReadForGather(g, r->shard(g).slot);
        REQUIRE(page.ok());
        CHECK(HoldsRounded(page->data, Values(g)));
      } else {
        CHECK(HoldsRounded(r->data(g), Values(g)));
      }
    }
  }
}

TEST_CASE("an updated shard on NVMe becomes current only when committed") {
  Fixture f(/*offload=*/true, /*nvme=*/true, /*max_in_cpu=*/0);
  auto r = f.Make().value();
  for (int g = 0; g < 3; ++g) REQUIRE(r->Allocate(g).ok());
  REQUIRE(r->AllocatePages().ok());
  for (int g = 0; g < 3; ++g) REQUIRE(r->Write(g, Values(g).data(), *f.stream, "test.init").ok());
  // The step leaves refreshed shards (bf16) in an aligned scratch buffer.
  DeviceBuffer scratch = f.device->AllocatePinned(2 * 4096, MemoryCategory::kWorkspace, "scratch").value();
  void* aligned = NvmeStore::AlignUp(scratch.data());
  std::vector<uint16_t> updated(kPadded);
  for (int64_t i = 0; i < kPadded; ++i) updated[i] = F32ToBf16(Values(100)[i]);
  std::memcpy(aligned, updated.data(), kPadded * 2);
  REQUIRE(r->WriteUpdated(1, aligned).ok());
  REQUIRE(r->FinishUpdates({1}).ok());
  // Written and synced, not committed: a gather still reads the old shard.
  std::vector<char> page(4096 + NvmeStore::kAlignment);
  void* read = NvmeStore::AlignUp(page.data());
  REQUIRE(r->store()->Read(r->shard(1).slot, read).ok());
  CHECK(HoldsRounded(read, Values(1)));
  REQUIRE(r->CommitUpdates({1}).ok());
  REQUIRE(r->store()->Read(r->shard(1).slot, read).ok());
  CHECK(HoldsRounded(read, Values(100)));
}

}  // namespace
}  // namespace memwall
