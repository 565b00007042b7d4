// Safetensors files as checkpoints and export write them: the header
// (dtype, shape, offsets; metadata; 8-byte alignment), the values (bf16
// rounded to nearest even), the file's size and CRC-32, what a failed
// write leaves, and the validation of what is read back.
#include "engine/safetensors.h"

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/test_files.h"
#include "engine/durable_file.h"

namespace memwall {
namespace {

using testing::ReadFile;
using testing::TestPath;

TEST_CASE("an f32 file: its header, its values, its size and CRC-32, read back") {
  const std::string path = TestPath("rank-00000.safetensors");
  auto file = SafetensorsWriter::Open(path, {{"b/master", {3}}, {"a/master", {2, 2}}});
  REQUIRE(file.ok());
  const float b[3] = {1.5f, -2.0f, 0.25f}, a[4] = {1, 2, 3, 4};
  REQUIRE(file->Append(b, 3).ok());
  REQUIRE(file->Append(a, 4).ok());
  const int64_t bytes = file->bytes();
  const uLong crc = file->crc();
  CHECK_FALSE(std::filesystem::exists(path));  // not before the commit
  REQUIRE(file->Commit().ok());

  const std::string text = ReadFile(path);
  uint64_t length = 0;
  std::memcpy(&length, text.data(), 8);
  // The header's keys sorted, the data in the order declared.
  CHECK(text.substr(8, length) ==
        R"({"a/master":{"data_offsets":[12,28],"dtype":"F32","shape":[2,2]},)"
        R"("b/master":{"data_offsets":[0,12],"dtype":"F32","shape":[3]}})");
  CHECK(static_cast<int64_t>(text.size()) == bytes);
  CHECK(bytes == 8 + static_cast<int64_t>(length) + 28);
  CHECK(crc == crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(text.data()),
                     static_cast<uInt>(text.size())));
  CHECK(FileCrc(path, bytes).value() == crc);
  std::vector<float> values(7);
  std::memcpy(values.data(), text.data() + 8 + length, 28);
  CHECK(values == std::vector<float>{1.5f, -2.0f, 0.25f, 1, 2, 3, 4});

  auto entries = ReadSafetensorsHeader(path, bytes);
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  CHECK(entries->at("a/master").offset == 8 + static_cast<int64_t>(length) + 12);
  CHECK(entries->at("a/master").numel == 4);
  CHECK(entries->at("b/master").offset == 8 + static_cast<int64_t>(length));
  CHECK(entries->at("b/master").file == path);
}

TEST_CASE("a bf16 file with metadata starts its data 8-byte aligned, values rounded") {
  const std::string path = TestPath("export.safetensors");
  SafetensorsWriter::Options options;
  options.dtype = DType::kBF16;
  options.metadata = {{"format", "pt"}, {"step", "7"}};
  options.align = true;
  auto file = SafetensorsWriter::Open(path, {{"w", {3}}}, options);
  REQUIRE(file.ok());
  // 1 + 2^-8 ties to 1 (even), 1 + 3 * 2^-8 to 1 + 2^-6, -0.1 rounds.
  const float w[3] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.1f};
  REQUIRE(file->Append(w, 3).ok());
  REQUIRE(file->Commit().ok());
  const std::string text = ReadFile(path);
  uint64_t length = 0;
  std::memcpy(&length, text.data(), 8);
  CHECK(length % 8 == 0);
  CHECK(text.substr(8, length).rfind(
            R"({"__metadata__":{"format":"pt","step":"7"},"w":{"data_offsets":[0,6],)"
            R"("dtype":"BF16","shape":[3]}})", 0) == 0);
  uint16_t bits[3];
  std::memcpy(bits, text.data() + 8 + length, 6);
  CHECK(bits[0] == 0x3F80);
  CHECK(bits[1] == 0x3F82);
  CHECK(bits[2] == 0xBDCD);
}

TEST_CASE("a failed write leaves no file, and a damaged one is refused by name") {
  const std::string path = TestPath("failed.safetensors");
  {
    auto file = SafetensorsWriter::Open(path, {{"x", {1000}}});
    REQUIRE(file.ok());
    std::vector<float> x(1000, 1.0f);
    InjectCheckpointWriteFailure(100);
    const absl::Status s = file->Append(x.data(), 1000);
    InjectCheckpointWriteFailure(-1);
    CHECK(s.code() == absl::StatusCode::kInternal);
    CHECK(s.message() == "checkpoint " + path + ".tmp: write (injected failure): " +
                             std::strerror(EIO));
  }  // abandoned: the temporary goes
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  const std::string good = TestPath("good.safetensors");
  auto file = SafetensorsWriter::Open(good, {{"x", {4}}});
  REQUIRE(file.ok());
  const float x[4] = {1, 2, 3, 4};
  REQUIRE(file->Append(x, 4).ok());
  const int64_t bytes = file->bytes();
  REQUIRE(file->Commit().ok());
  std::filesystem::resize_file(good, bytes - 4);  // truncated
  const absl::StatusOr<uLong> crc = FileCrc(good, bytes);
  CHECK(crc.status().code() == absl::StatusCode::kDataLoss);
  CHECK(crc.status().message() == "checkpoint " + good + ": " + std::to_string(bytes - 4) +
                                      " bytes, the manifest says " + std::to_string(bytes) +
                                      " (truncated or replaced)");
  const auto entries = ReadSafetensorsHeader(good, bytes - 4);
  CHECK(entries.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(entries.status().message()),
             Catch::StartsWith("checkpoint " + good + " tensor 'x': expected F32 data of 16 bytes "
                               "within the file's 12, got dtype F32 at [0,16]"));
}

}  // namespace
}  // namespace memwall
