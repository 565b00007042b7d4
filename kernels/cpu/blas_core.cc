#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memwall {
namespace kernels {
namespace cpu {
namespace {

// OpenBLAS's generic x86-64 kernel sets, which its detection falls back to
// on processors missing from its table (OpenBLAS's driver/others/dynamic.c).
const std::set<std::string>& GenericCores() {
  static const auto* const cores = new std::set<std::string>{
      "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
      "Northwood", "Banias", "Barcelona", "Opteron", "Opteron(SSE3)", "Bobcat"};
  return *cores;
}

// The version word of openblas_get_config(): "OpenBLAS 0.3.21 ...".
std::string BlasVersion() {
  std::istringstream config(openblas_get_config());
  std::string name, version;
  config >> name >> version;
  return absl::StrCat(name, " ", version);
}

}  // namespace

std::string BlasCore() { return openblas_get_corename(); }

std::string BetterBlasCore(const std::set<std::string>& flags, const std::string& detected) {
  if (GenericCores().count(detected) == 0) return "";
  const auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (flags.count(n) == 0) return false;
    }
    return true;
  };
  // The newest kernel set whose instructions the CPU has.
  if (has({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})) {
    return has({"avx512_bf16"}) ? "Cooperlake" : "SkylakeX";
  }
  if (has({"avx2", "fma"})) return "Haswell";
  if (has({"avx"})) return "Sandybridge";
  return "";
}

std::set<std::string> CpuFlags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

std::string BlasDescription() {
  std::string how = "its own detection";
  if (const char* from = std::getenv("MEMWALL_BLAS_CORE_FROM")) {
    how = absl::StrCat("chosen by memwall from the CPU's instruction sets: OpenBLAS's "
                       "detection gave ", from);
  } else if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user && *user) {
    how = absl::StrCat("OPENBLAS_CORETYPE=", user, " set by the user");
  }
  return absl::StrCat(BlasVersion(), ", core ", BlasCore(), " (", how, ")");
}

void ChooseBlasCore(char** argv) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if ((user != nullptr && *user != '\0') || std::getenv("MEMWALL_BLAS_CORE_FROM") != nullptr) {
    return;  // the user's choice, or memwall's already made
  }
  // Tests stand in for a CPU OpenBLAS does not know (this machine's is).
  const char* pretend = std::getenv("MEMWALL_BLAS_PRETEND_DETECTED");
  const std::string detected = pretend != nullptr ? pretend : BlasCore();
  const std::string better = BetterBlasCore(CpuFlags(), detected);
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv("MEMWALL_BLAS_CORE_FROM", detected.c_str(), 1);
  execv("/proc/self/exe", argv);
  // The exec failed: go on as loaded, and do not claim the choice.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("MEMWALL_BLAS_CORE_FROM");
}

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
