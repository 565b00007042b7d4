// The memory profiler's overhead on real training steps: gpt-tiny on the
// host backend, steps timed with the profiler attached (recording every
// allocator event and phase) and without, interleaved so both see the same
// machine state; the median step time of each and their ratio.
//
//   bazel run //benchmarks:profiler_benchmark [-- --steps 40]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "engine/trainer.h"
#include "models/corpus.h"
#include "models/gpt.h"
#include "profiler/memory_profiler.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

int Main(int argc, char** argv) {
  int steps = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--steps") steps = std::atoi(argv[i + 1]);
  }
  auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  const GptConfig c = GptPreset("gpt-tiny").value();
  ShardingOptions options;
  options.zero.stage = 3;  // the most events per step
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                 options, *device, *comm, 1).value();
  const ByteCorpus corpus = ByteCorpus::Synthetic(1 << 20, 1234);
  std::vector<double> with, without;
  size_t events = 0;
  for (int step = 0; step < 2 * steps + 2; ++step) {
    const bool profiled = step % 2 == 1;
    // Odd steps: a profiler listening to every event and marking phases;
    // even steps: none attached at all (the baseline).
    std::optional<MemoryProfiler> profiler;
    if (profiled) profiler.emplace(device->allocator(), /*ring_capacity=*/1 << 16);
    trainer->set_profiler(profiled ? &*profiler : nullptr);
    Batch b = corpus.MakeBatch(*device, 0, 8, c.seq, step).value();
    const auto start = std::chrono::steady_clock::now();
    if (!trainer->TrainStep({&b, 1}).ok()) return 1;
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    trainer->set_profiler(nullptr);
    if (profiled) events = profiler->timeline().size();
    if (step < 2) continue;  // warm-up
    (profiled ? with : without).push_back(took.count());
  }
  std::sort(with.begin(), with.end());
  std::sort(without.begin(), without.end());
  const double a = with[with.size() / 2], b = without[without.size() / 2];
  std::printf("profiler_benchmark: gpt-tiny, ZeRO-3, host, %d steps each (interleaved)\n", steps);
  std::printf("median step: %.3f ms profiled (every allocator event recorded, phases marked; "
              "%zu events per step), %.3f ms without a profiler; overhead %.2f%%\n",
              a, events, b, 100.0 * (a - b) / b);
  return 0;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc, argv); }
