// The aio measurement and sweep behind `memwall tune-aio`: the settings
// swept, the bytes each pass moves, and bad settings named.
#include "offload/aio_tune.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

using Setting = std::tuple<int64_t, int, int>;  // block, depth, threads

std::vector<Setting> Settings(const std::vector<AioConfig>& sweep) {
  std::vector<Setting> out;
  for (const AioConfig& a : sweep) {
    CHECK_FALSE(a.single_submit);
    CHECK(a.overlap_events);
    out.emplace_back(a.block_size, a.queue_depth, a.thread_count);
  }
  return out;
}

TEST_CASE("the sweep: settings whose buffers fit, by chunk size", "[aio][tune]") {
  constexpr int64_t K = 1024, M = 1024 * 1024;
  // 8 MiB through 4 buffers: chunks up to 2 MiB.
  const std::vector<Setting> small = {{128 * K, 1, 1}, {128 * K, 1, 2}, {128 * K, 4, 1},
                                      {512 * K, 1, 1}, {128 * K, 4, 2}, {128 * K, 8, 1},
                                      {512 * K, 1, 2}, {1 * M, 1, 1},   {128 * K, 8, 2},
                                      {512 * K, 4, 1}, {1 * M, 1, 2}};
  CHECK(Settings(AioSweep(8 * M, 4)) == small);
  // 1 GiB: all 32 (the largest chunk, 4 MiB x 32 x 2, four times over is
  // 1 GiB), DeepSpeed's default (1 MiB, 8, 1) among them.
  const std::vector<Setting> all = Settings(AioSweep(1024 * M, 4));
  CHECK(all.size() == 32);
  CHECK(std::count(all.begin(), all.end(), Setting{1 * M, 8, 1}) == 1);
  CHECK(all.back() == Setting{4 * M, 32, 2});
  // A slot smaller than 4 of the smallest chunk: nothing to try.
  CHECK(AioSweep(256 * K, 4).empty());
  CHECK(Settings(AioSweep(256 * K, 2)) == std::vector<Setting>{{128 * K, 1, 1}});
}

TEST_CASE("a measurement moves the slot's bytes each way and leaves no file", "[aio][tune]") {
  const std::string dir = TempDir() + "/aio_tune";
  std::filesystem::create_directories(dir);
  AioConfig aio;
  aio.block_size = 64 * 1024;
  aio.queue_depth = 2;  // 128 KiB chunks
  const absl::StatusOr<AioThroughput> t = MeasureAio(dir, aio, 3, 16 * 128 * 1024, 2);
  REQUIRE(t.ok());
  CHECK(t->write_mbps > 0);
  CHECK(t->read_mbps > 0);
  CHECK(t->update_mbps > 0);
  CHECK(std::filesystem::is_empty(dir));
}

TEST_CASE("bad settings are named", "[aio][tune][errors]") {
  AioConfig aio;  // 8 MiB chunks
  const std::string dir = TempDir();
  const auto message = [&](const AioConfig& a, int buffers, int64_t bytes, int repeats) {
    const absl::StatusOr<AioThroughput> t = MeasureAio(dir, a, buffers, bytes, repeats);
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  CHECK(message(aio, 4, 12 << 20, 1) ==
        "bytes: expected a positive multiple of the chunk (block_size x queue_depth x "
        "thread_count = 8388608 bytes), got 12582912");
  CHECK(message(aio, 0, 8 << 20, 1) == "buffer_count: expected at least 1, got 0");
  CHECK(message(aio, 1, 8 << 20, 0) == "repeats: expected at least 1, got 0");
  AioConfig odd = aio;
  odd.block_size = 1000;
  odd.queue_depth = 1;
  CHECK(message(odd, 1, 8000, 1) ==
        "aio: expected block_size x queue_depth x thread_count a positive multiple of 4096 "
        "bytes, got 1000");
  const absl::StatusOr<AioThroughput> missing =
      MeasureAio("/nonexistent/memwall", aio, 1, 8 << 20, 1);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() ==
        "NVMe store /nonexistent/memwall: cannot use the directory: No such file or directory");
}

}  // namespace
}  // namespace memwall
