// Replays every input kept in tests/fuzz/corpus/<target>/ (the seeds, and
// each input a fuzzing run found to crash, once fixed) through its target in
// the normal build, so a crash found once stays fixed. Under --config=asan
// (tools/sanitize.sh) the replay also checks memory safety.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/fuzz/targets.h"

namespace memwall {
namespace {

namespace fs = std::filesystem;

TEST_CASE("every kept fuzzing input runs through its target", "[fuzz]") {
  const std::map<std::string, std::function<void(const uint8_t*, size_t)>> targets = {
      {"config", fuzz::Config}, {"model_spec", fuzz::ModelSpec}, {"checkpoint", fuzz::Checkpoint}};
  for (const auto& [name, target] : targets) {
    int inputs = 0;
    for (const auto& entry : fs::directory_iterator(fs::path("tests/fuzz/corpus") / name)) {
      INFO(entry.path().string());
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++inputs;
    }
    INFO(name);
    CHECK(inputs >= 2);  // the seeds are there: the replay is not empty
  }
}

}  // namespace
}  // namespace memwall
