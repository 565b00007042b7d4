#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <dlfcn.h>
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

namespace {

// What OpenBLAS detected and the better core to run instead; `better`
// empty when the user chose (OPENBLAS_CORETYPE), memwall already chose
// (MEMWALL_BLAS_CORE_FROM), or OpenBLAS knows the CPU.
struct CoreChoice {
  std::string detected;
  std::string better;
};

CoreChoice ChooseCore() {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if ((user != nullptr && *user != '\0') || std::getenv("MEMWALL_BLAS_CORE_FROM") != nullptr) {
    return {};
  }
  // Tests stand in for a CPU OpenBLAS does not know (this machine's is).
  const char* pretend = std::getenv("MEMWALL_BLAS_PRETEND_DETECTED");
  CoreChoice choice;
  choice.detected = pretend != nullptr ? pretend : BlasCore();
  choice.better = BetterBlasCore(CpuFlags(), choice.detected);
  return choice;
}

void SetChoice(const CoreChoice& choice) {
  setenv("OPENBLAS_CORETYPE", choice.better.c_str(), 1);
  setenv("MEMWALL_BLAS_CORE_FROM", choice.detected.c_str(), 1);
}

void UnsetChoice() {
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("MEMWALL_BLAS_CORE_FROM");
}

}  // namespace

void ChooseBlasCore(char** argv) {
  const CoreChoice choice = ChooseCore();
  if (choice.better.empty()) return;
  SetChoice(choice);
  execv("/proc/self/exe", argv);
  // The exec failed: go on as loaded, and do not claim the choice.
  UnsetChoice();
}

std::string ChooseBlasCoreInProcess() {
  const CoreChoice choice = ChooseCore();
  if (choice.better.empty()) return "";
  // Looked up, not linked: only DYNAMIC_ARCH builds of OpenBLAS have them.
  using Hook = void (*)();
  const auto quit = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  const auto init = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return "";
  const std::string before = BlasCore();
  SetChoice(choice);
  quit();
  init();
  if (BlasCore() == choice.better) return choice.better;
  // OpenBLAS did not take the name (it then detects again): restore what
  // it ran before and do not claim the choice.
  UnsetChoice();
  setenv("OPENBLAS_CORETYPE", before.c_str(), 1);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
  return "";
}

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
