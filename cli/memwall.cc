// The `memwall` command.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/demo.h"
#include "runtime/device.h"
#include "runtime/units.h"

ABSL_FLAG(std::string, backend, "host",
          "Device backend: host (host RAM posing as a device with an enforced capacity) or meta "
          "(accounting only: no bytes, any size).");
ABSL_FLAG(std::string, device_memory, "256MiB",
          "Device capacity per rank, e.g. 256MiB, 32GiB or 32GB (binary and decimal units).");
ABSL_FLAG(std::string, params, "8388608",
          "Parameters of the demo's toy model (a count; 1e9 style is accepted).");

namespace {

constexpr char kUsage[] = R"(break the memory wall of large-model training.

usage:
  memwall demo [--backend host|meta] [--device_memory SIZE] [--params N]
      One ZeRO-style optimizer step on tagged device memory: f32 gradients
      are reduce-scattered across the MPI ranks, each rank runs Adam on its
      shard, and the bf16 parameters are all-gathered. Every rank checks the
      gathered parameters against a single-process update; rank 0 prints the
      peak device memory by category for every rank and the bytes moved.
      Run it on K ranks with:  mpirun -np K memwall demo
      (as root add --allow-run-as-root; tools/demo.sh does all of this).

  memwall --help      this text and every flag

exit status: 0 on success, 1 on an error (printed), 2 on bad usage.)";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "memwall: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2 || std::string(positional[1]) != "demo") {
    std::fprintf(stderr, "memwall: %s\n", kUsage);
    return 2;
  }
  memwall::DemoOptions options;
  auto backend = memwall::ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) return Fail(backend.status());
  options.backend = *backend;
  auto capacity = memwall::ParseBytes(absl::GetFlag(FLAGS_device_memory), "--device_memory");
  if (!capacity.ok()) return Fail(capacity.status());
  options.capacity_bytes = *capacity;
  double params = 0;
  const std::string params_text = absl::GetFlag(FLAGS_params);
  if (!absl::SimpleAtod(params_text, &params) || params < 1 || params > 1e15 ||
      params != static_cast<double>(static_cast<int64_t>(params))) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--params: expected a whole number of parameters between 1 and 1e15, got '",
        params_text, "'")));
  }
  options.parameters = static_cast<int64_t>(params);
  const absl::Status status = memwall::RunDemo(options);
  if (!status.ok()) return Fail(status);
  return 0;
}
