#include "tests/fuzz/targets.h"

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "models/gpt.h"

namespace memwall::fuzz {
namespace {

// A directory of this process's own, made once.
const std::string& Scratch() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = absl::StrCat(tmp ? tmp : "/tmp", "/memwall-fuzz-XXXXXX");
    return std::string(::mkdtemp(pattern.data()));
  }();
  return dir;
}

void Write(const std::string& path, const char* data, size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(data, static_cast<std::streamsize>(size));
}

}  // namespace

void Config(const uint8_t* data, size_t size) {
  (void)ParseConfig(std::string(reinterpret_cast<const char*>(data), size));
}

void ModelSpec(const uint8_t* data, size_t size) {
  const absl::StatusOr<GptConfig> c = ParseGptModel(std::string(reinterpret_cast<const char*>(data), size));
  if (c.ok()) (void)GptParameterCount(*c);
}

void Checkpoint(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string& dir = Scratch();
  const char* body = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  std::remove((dir + "/rank-00000.safetensors").c_str());
  if (data[0] % 2 == 0) {
    Write(dir + "/manifest.json", body, n);
  } else {
    Write(dir + "/rank-00000.safetensors", body, n);
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body), static_cast<uInt>(n));
    const std::string manifest = absl::StrCat(
        R"({"schema": "memwall.checkpoint/1", "trainer_steps": 1, "progress": {"steps_applied": 1,)",
        R"( "steps_skipped": 0, "loss_scale": 1.0, "clean_steps": 1, "overflows_left": 0},)",
        R"( "states": ["master"], "parameters": [{"name": "p", "shape": [4], "file": "rank-00000.safetensors"}],)",
        R"( "files": [{"name": "rank-00000.safetensors", "bytes": )", n, R"(, "crc32": )", crc, "}]}");
    Write(dir + "/manifest.json", manifest.data(), manifest.size());
  }
  (void)VerifyCheckpoint(dir);
}

}  // namespace memwall::fuzz
