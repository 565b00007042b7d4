// Durable checkpoint file writes: whole writes with their CRC-32, atomic
// replacement, and an injected write failure that leaves the old file and
// no temporary behind.
#include "engine/durable_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <string>

#include "catch2/catch.hpp"
#include "tests/support/test_files.h"

namespace memwall {
namespace {

using testing::ReadFile;
using testing::TestPath;

TEST_CASE("WriteAll writes every byte and adds them to the CRC-32 as zlib computes it") {
  const std::string path = TestPath("write_all.bin");
  const std::string data(100000, 'x');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  uLong crc = crc32(0L, Z_NULL, 0);
  REQUIRE(WriteAll(fd, path, data.data(), 40000, crc).ok());
  REQUIRE(WriteAll(fd, path, data.data() + 40000, 60000, crc).ok());
  ::close(fd);
  CHECK(ReadFile(path) == data);
  CHECK(crc == crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), 100000));
  REQUIRE(SyncPath(path, /*directory=*/false).ok());
}

TEST_CASE("a file is replaced atomically, and a failed write leaves the old one") {
  const std::string path = TestPath("manifest.json");
  REQUIRE(WriteFileAtomically(path, "old").ok());
  CHECK(ReadFile(path) == "old");
  REQUIRE(WriteFileAtomically(path, "new contents").ok());
  CHECK(ReadFile(path) == "new contents");
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  InjectCheckpointWriteFailure(4);  // the next 12 bytes fail after 4
  const absl::Status failed = WriteFileAtomically(path, "newer content");
  InjectCheckpointWriteFailure(-1);
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK(failed.message() == "checkpoint " + path + ".tmp: write (injected failure): " +
                                std::strerror(EIO));
  CHECK(ReadFile(path) == "new contents");
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("errors name the path, what failed and the system's reason") {
  const absl::Status s = SyncPath(TestPath("no/such/dir"), /*directory=*/true);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(s.message() ==
        "checkpoint " + TestPath("no/such/dir") + ": open for fsync: " + std::strerror(ENOENT));
}

}  // namespace
}  // namespace memwall
