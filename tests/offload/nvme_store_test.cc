// The NVMe tier's file: round trips, the committed copy surviving a failed
// write, and errors that name the path.
#include "offload/nvme_store.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

// An aligned buffer of n bytes filled with `byte`.
struct Buffer {
  explicit Buffer(int64_t n, char byte) : size(n) {
    data = static_cast<char*>(std::aligned_alloc(NvmeStore::kAlignment, n));
    std::memset(data, byte, n);
  }
  ~Buffer() { std::free(data); }
  char* data;
  int64_t size;
};

TEST_CASE("slots round-trip and a failed write keeps the committed copy", "[nvme]") {
  auto store = NvmeStore::Open(TempDir(), "roundtrip.bin");
  REQUIRE(store.ok());
  INFO("O_DIRECT: " << (*store)->direct());
  const int a = (*store)->AddSlot(5000).value();  // rounds to 8192 per copy
  const int b = (*store)->AddSlot(4096).value();
  CHECK((*store)->size() == 2 * 8192 + 2 * 4096);
  Buffer one(8192, 'x'), two(4096, 'y'), back(8192, 0);
  REQUIRE((*store)->Write(a, one.data).ok());
  REQUIRE((*store)->Commit(a).ok());
  REQUIRE((*store)->Write(b, two.data).ok());
  REQUIRE((*store)->Commit(b).ok());
  REQUIRE((*store)->Read(a, back.data).ok());
  CHECK(std::memcmp(back.data, one.data, 8192) == 0);
  REQUIRE((*store)->Read(b, back.data).ok());
  CHECK(std::memcmp(back.data, two.data, 4096) == 0);

  // A write that dies half way: an error naming the file; the committed
  // copy still reads back whole, and there is nothing to commit.
  Buffer newer(8192, 'z');
  (*store)->InjectWriteFailureAfter(4096);
  const absl::Status failed = (*store)->Write(a, newer.data);
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK(std::string(failed.message()) ==
        "NVMe store " + (*store)->path() + ": write failed: Input/output error");
  const absl::Status commit = (*store)->Commit(a);
  CHECK(commit.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE((*store)->Read(a, back.data).ok());
  CHECK(std::memcmp(back.data, one.data, 8192) == 0);
  // Written but not committed: reads still see the old copy.
  (*store)->InjectWriteFailureAfter(-1);
  REQUIRE((*store)->Write(a, newer.data).ok());
  REQUIRE((*store)->Read(a, back.data).ok());
  CHECK(std::memcmp(back.data, one.data, 8192) == 0);
  REQUIRE((*store)->Commit(a).ok());
  REQUIRE((*store)->Read(a, back.data).ok());
  CHECK(std::memcmp(back.data, newer.data, 8192) == 0);

  // The file has no name while the store lives (so a run ended by Ctrl-C
  // or kill -9 leaves nothing), and goes with the store.
  const std::string path = (*store)->path();
  CHECK_FALSE(std::ifstream(path).good());
  store->reset();
  CHECK_FALSE(std::ifstream(path).good());
}

TEST_CASE("bad paths are named", "[nvme][errors]") {
  const auto missing = NvmeStore::Open("/nonexistent/memwall", "x.bin");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() ==
        "NVMe store /nonexistent/memwall: cannot use the directory: No such file or directory");
  const std::string file = TempDir() + "/plain-file";
  std::ofstream(file) << "not a directory";
  const auto not_dir = NvmeStore::Open(file, "x.bin");
  CHECK(not_dir.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(not_dir.status().message() ==
        "NVMe store " + file + ": expected a directory (nvme_path)");
  // A name in the directory right now is not taken over.
  const std::string taken = TempDir() + "/taken.bin";
  std::ofstream(taken) << "someone's";
  const auto clash = NvmeStore::Open(TempDir(), "taken.bin");
  CHECK(clash.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(clash.status().message() == "NVMe store " + taken + ": cannot create the file: File exists");
  std::ifstream kept(taken);
  std::string text;
  std::getline(kept, text);
  CHECK(text == "someone's");
}

TEST_CASE("two stores of one name are two files, neither in the directory", "[nvme]") {
  auto first = NvmeStore::Open(TempDir(), "twice.bin");
  auto second = NvmeStore::Open(TempDir(), "twice.bin");
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  const int a = (*first)->AddSlot(4096).value(), b = (*second)->AddSlot(4096).value();
  Buffer x(4096, 'x'), y(4096, 'y'), back(4096, 0);
  REQUIRE((*first)->Write(a, x.data).ok());
  REQUIRE((*first)->Commit(a).ok());
  REQUIRE((*second)->Write(b, y.data).ok());
  REQUIRE((*second)->Commit(b).ok());
  REQUIRE((*first)->Read(a, back.data).ok());
  CHECK(std::memcmp(back.data, x.data, 4096) == 0);
  REQUIRE((*second)->Read(b, back.data).ok());
  CHECK(std::memcmp(back.data, y.data, 4096) == 0);
  CHECK_FALSE(std::ifstream(TempDir() + "/twice.bin").good());
}

}  // namespace
}  // namespace memwall
