// The NVMe tier's asynchronous I/O: every setting moves the bytes exactly,
// transfers run concurrently, and errors name the file and the cause.
#include "offload/aio_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

struct Aligned {
  explicit Aligned(int64_t n) : size(n) { data = static_cast<char*>(std::aligned_alloc(4096, n)); }
  ~Aligned() { std::free(data); }
  char* data;
  int64_t size;
};

// A file opened with O_DIRECT where the filesystem allows it.
int OpenFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  return fd;
}

TEST_CASE("every aio setting writes and reads back the same bytes", "[aio]") {
  const std::string path = TempPath("aio_roundtrip.bin");
  const int fd = OpenFile(path);
  REQUIRE(fd >= 0);
  const int64_t bytes = 5 * 4096 * 37;  // not a multiple of the block sizes below
  Aligned out(bytes), in(bytes);
  for (int64_t i = 0; i < bytes; ++i) out.data[i] = static_cast<char>((i * 131 + 7) % 251);
  for (int64_t block : {int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
    for (int depth : {1, 4, 32}) {
      for (int threads : {1, 3}) {
        for (bool single : {false, true}) {
          for (bool overlap : {true, false}) {
            INFO("block " << block << " depth " << depth << " threads " << threads << " single "
                          << single << " overlap " << overlap);
            AioConfig config{block, depth, threads, single, overlap};
            auto engine = AioEngine::Create(config).value();
            std::memset(in.data, 0, bytes);
            // Two transfers at once: the file's two halves (at 4 KiB
            // boundaries), the second submitted before the first is waited.
            const int64_t half = bytes / 2 / 4096 * 4096;
            auto a = engine->Submit(fd, path, true, 0, out.data, half);
            auto b = engine->Submit(fd, path, true, half, out.data + half, bytes - half);
            REQUIRE(engine->Wait(b).ok());
            REQUIRE(engine->Wait(a).ok());
            REQUIRE(engine->Wait(engine->Submit(fd, path, false, 0, in.data, bytes)).ok());
            CHECK(std::memcmp(in.data, out.data, bytes) == 0);
          }
        }
      }
    }
  }
  ::close(fd);
  ::unlink(path.c_str());
}

TEST_CASE("aio errors name the file, the byte and the cause", "[aio][errors]") {
  auto engine = AioEngine::Create(AioConfig()).value();
  Aligned buffer(8192);
  // Reading past the end of a file: a short read, named.
  const std::string path = TempPath("aio_short.bin");
  const int fd = OpenFile(path);
  REQUIRE(fd >= 0);
  std::memset(buffer.data, 1, 8192);
  REQUIRE(engine->Wait(engine->Submit(fd, path, true, 0, buffer.data, 4096)).ok());
  const absl::Status short_read =
      engine->Wait(engine->Submit(fd, path, false, 0, buffer.data, 8192));
  CHECK(short_read.code() == absl::StatusCode::kDataLoss);
  CHECK(short_read.message() ==
        "NVMe store " + path + ": short read at byte 0 (4096 of 8192 bytes)");
  // A file opened read-only refuses a write: the system's reason.
  const int read_only = ::open(path.c_str(), O_RDONLY);
  const absl::Status refused =
      engine->Wait(engine->Submit(read_only, path, true, 0, buffer.data, 4096));
  CHECK(refused.code() == absl::StatusCode::kInternal);
  CHECK(refused.message() == "NVMe store " + path + ": write failed: Bad file descriptor");
  ::close(read_only);
  ::close(fd);
  ::unlink(path.c_str());

  // Bad settings name the key.
  AioConfig bad;
  bad.block_size = 1000;
  CHECK(AioEngine::Create(bad).status().message() ==
        "aio.block_size: expected a multiple of 4096 bytes, got 1000");
  bad = AioConfig();
  bad.queue_depth = 0;
  CHECK(AioEngine::Create(bad).status().message() == "aio.queue_depth: expected 1..1024, got 0");
  bad = AioConfig();
  bad.thread_count = 65;
  CHECK(AioEngine::Create(bad).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AioEngine::Create(bad).status().message() == "aio.thread_count: expected 1..64, got 65");
}

}  // namespace
}  // namespace memwall
