// Files a test writes: paths in Bazel's per-test directory, and reading
// one back whole.
#ifndef MEMWALL_TESTS_SUPPORT_TEST_FILES_H_
#define MEMWALL_TESTS_SUPPORT_TEST_FILES_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace memwall::testing {

// Bazel's TEST_TMPDIR (or /tmp outside Bazel).
inline std::string TestDirectory() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// `name` in TestDirectory().
inline std::string TestPath(const std::string& name) { return TestDirectory() + "/" + name; }

// The bytes of the file at `path` (empty if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_TEST_FILES_H_
