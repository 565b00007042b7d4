// ParamPages: parameter shards on NVMe through pinned page buffers, on the
// host backend with a real file (O_DIRECT where the test's directory
// allows it) and on meta with a virtual store.
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/test_files.h"
#include "runtime/device.h"
#include "runtime/units.h"
#include "sharding/param_pages.h"

namespace memwall {
namespace {

using testing::TestDirectory;

// 1000 shard elements of bf16 (2000 bytes: one 4 KiB block each copy).
constexpr int64_t kShard = 1000;

std::vector<float> Values(int seed) {
  std::vector<float> v(kShard);
  // Not representable in bf16: the write rounds each.
  for (int64_t i = 0; i < kShard; ++i) v[i] = 1.0f + (i + seed) * (1.0f / 4096) + 1e-6f;
  return v;
}

bool HoldsRounded(const void* page, const std::vector<float>& values) {
  const auto* bits = static_cast<const uint16_t*>(page);
  for (int64_t i = 0; i < kShard; ++i) {
    if (bits[i] != F32ToBf16(values[i])) return false;
  }
  return true;
}

struct Fixture {
  std::unique_ptr<Device> device =
      CreateDevice({Backend::kHost, 0, 16 * kMiB, 16 * kMiB}).value();
  std::unique_ptr<ParamPages> pages;
  std::vector<int> slots;

  explicit Fixture(int page_count) {
    auto store = NvmeStore::Open(TestDirectory(), "param_pages_test.bin").value();
    pages = std::make_unique<ParamPages>(*device, std::move(store));
    for (int g = 0; g < 4; ++g) slots.push_back(pages->store().AddSlot(kShard * 2).value());
    REQUIRE(pages->AllocatePages(page_count, kShard * 2).ok());
  }
};

TEST_CASE("a written shard is read back for its gather rounded to the parameter dtype") {
  Fixture f(2);
  // Pinned workspace: two pages of one block each, plus a block to align them.
  CHECK(f.device->pinned_allocator()->stats().requested.current == 3 * 4096);
  for (int g = 0; g < 4; ++g) {
    REQUIRE(f.pages->WriteFromF32(f.slots[g], Values(g).data(), kShard, DType::kBF16).ok());
  }
  for (int g : {2, 0, 3}) {
    auto page = f.pages->ReadForGather(g, f.slots[g]);
    REQUIRE(page.ok());
    CHECK(HoldsRounded(page->data, Values(g)));
  }
}

TEST_CASE("reads ahead leave one page free, serve their gather, and are dropped when unused") {
  Fixture f(3);
  for (int g = 0; g < 4; ++g) {
    REQUIRE(f.pages->WriteFromF32(f.slots[g], Values(g).data(), kShard, DType::kBF16).ok());
  }
  const int64_t read = f.pages->store().bytes_read();
  REQUIRE(f.pages->ReadAhead(1, f.slots[1]).ok());
  REQUIRE(f.pages->ReadAhead(1, f.slots[1]).ok());  // under way already: no second read
  REQUIRE(f.pages->ReadAhead(2, f.slots[2]).ok());
  REQUIRE(f.pages->ReadAhead(3, f.slots[3]).ok());  // would leave no page free: not read
  CHECK(f.pages->ReadsAhead(1));
  CHECK(f.pages->ReadsAhead(2));
  CHECK_FALSE(f.pages->ReadsAhead(3));
  CHECK(f.pages->store().bytes_read() - read == 2 * 4096);

  // Group 1's gather takes its read ahead: nothing more is read.
  auto page = f.pages->ReadForGather(1, f.slots[1]);
  REQUIRE(page.ok());
  CHECK(HoldsRounded(page->data, Values(1)));
  CHECK_FALSE(f.pages->ReadsAhead(1));
  CHECK(f.pages->store().bytes_read() - read == 2 * 4096);
  // Group 3's is read now, into the free page.
  page = f.pages->ReadForGather(3, f.slots[3]);
  REQUIRE(page.ok());
  CHECK(HoldsRounded(page->data, Values(3)));
  CHECK(f.pages->store().bytes_read() - read == 3 * 4096);

  f.pages->DropReadAheads();
  CHECK_FALSE(f.pages->ReadsAhead(2));
}

TEST_CASE("on meta a virtual store counts what a real run writes and reads") {
  auto device = CreateDevice({Backend::kMeta, 0, 16 * kMiB, 16 * kMiB}).value();
  ParamPages pages(*device, NvmeStore::Virtual("/nvme/params.bin"));
  const int slot = pages.store().AddSlot(kShard * 2).value();
  REQUIRE(pages.AllocatePages(2, kShard * 2).ok());
  REQUIRE(pages.WriteFromF32(slot, nullptr, kShard, DType::kBF16).ok());
  REQUIRE(pages.ReadForGather(0, slot).ok());
  CHECK(pages.store().bytes_written() == 4096);
  CHECK(pages.store().bytes_read() == 4096);
  CHECK(pages.store().size() == 2 * 4096);
}

}  // namespace
}  // namespace memwall
