// Progress of long planning work: what a report line says (the task, the
// stage, the dry-run step's open phases), when reports are printed, and
// that the dry run and the auto strategy tell the progress what they do.
#include "engine/progress.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "engine/auto_strategy.h"
#include "engine/dry_run.h"
#include "models/spec.h"
#include "runtime/device.h"
#include "runtime/units.h"

namespace memwall {
namespace {

std::string Contents(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) out.append(buffer, n);
  return out;
}

TEST_CASE("a progress line names the task, the stage and the step's open phases", "[progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  auto device = CreateDevice(DeviceOptions{Backend::kMeta, 0, kGiB}).value();
  MemoryProfiler profiler(device->allocator());
  {
    PlanProgress progress(out, "test", std::chrono::hours(1));
    CHECK(progress.Line() == "working");
    progress.SetTask("candidate 2 of 5 (stage 3)");
    CHECK(progress.Line() == "candidate 2 of 5 (stage 3)");
    progress.SetStage("dry-run step of 4 layers", &profiler);
    CHECK(progress.Line() == "candidate 2 of 5 (stage 3): dry-run step of 4 layers");
    profiler.BeginPhase("step 0");
    profiler.BeginPhase("forward");
    profiler.BeginPhase("block2");
    CHECK(progress.Line() ==
          "candidate 2 of 5 (stage 3): dry-run step of 4 layers (step 0 > forward > block2)");
    profiler.EndPhase();
    CHECK(progress.Line() ==
          "candidate 2 of 5 (stage 3): dry-run step of 4 layers (step 0 > forward)");
    {
      ScopedProgressStage stage(&progress, "planning recomputation");
      CHECK(progress.Line() == "candidate 2 of 5 (stage 3): planning recomputation");
    }
    progress.SetTask("");
    CHECK(progress.Line() == "working");
    // Work that ends within the quiet interval prints nothing.
    CHECK(progress.reports() == 0);
  }
  CHECK(Contents(out).empty());
  std::fclose(out);
}

TEST_CASE("after the quiet interval a line is printed at every interval", "[progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  int reports = 0;
  {
    PlanProgress progress(out, "memwall plan", std::chrono::milliseconds(0),
                          std::chrono::milliseconds(10));
    progress.SetTask("dry run");
    while (progress.reports() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    reports = progress.reports();
  }
  const std::string text = Contents(out);
  std::fclose(out);
  // "memwall plan: 0 s: dry run" lines, one per report (each printed whole).
  std::vector<std::string> lines;
  for (size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos;
       begin = end + 1) {
    lines.push_back(text.substr(begin, end - begin));
  }
  REQUIRE(static_cast<int>(lines.size()) >= reports);
  // With no quiet interval the watcher may report before SetTask: such
  // lines say "working", and come first.
  size_t first = 0;
  while (first < lines.size() && lines[first] == "memwall plan: 0 s: working") ++first;
  REQUIRE(first < lines.size());
  for (size_t i = first; i < lines.size(); ++i) CHECK(lines[i] == "memwall plan: 0 s: dry run");
}

TEST_CASE("the dry run and the auto strategy say what they are doing", "[progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  PlanProgress progress(out, "test", std::chrono::hours(1));
  // The model is built inside the dry run's first stage: the factory sees
  // the line a report would print then.
  std::vector<std::string> seen;
  DryRunOptions options;
  const ModelFactory gpt = SpecModel("gpt-tiny");
  options.model = [&](int64_t batch) {
    seen.push_back(progress.Line());
    return gpt(batch);
  };
  options.progress = &progress;
  Config config;
  config.train_micro_batch_size_per_gpu = 2;
  REQUIRE(DryRun(options, config).ok());
  CHECK(seen == std::vector<std::string>{"building the model"});
  CHECK(progress.Line() == "working");  // the stage is cleared at the end

  seen.clear();
  const AutoResult r = AutoStrategy(options, config, HardwarePreset("a100-40gb").value()).value();
  // Each candidate's dry run builds its model at least once (the optimal
  // planner's own dry run builds it again, while planning recomputation).
  size_t k = 0;
  for (const std::string& line : seen) {
    const auto prefix = [&](size_t i) {
      return "candidate " + std::to_string(i + 1) + " of " + std::to_string(r.candidates.size()) +
             " (" + r.candidates[i].name + "): ";
    };
    if (k + 1 < r.candidates.size() && line.rfind(prefix(k + 1), 0) == 0) ++k;
    INFO(line);
    CHECK(
        (line == prefix(k) + "building the model" || line == prefix(k) + "planning recomputation"));
  }
  CHECK(k + 1 == r.candidates.size());
  CHECK(progress.Line() == "working");
  std::fclose(out);
}

}  // namespace
}  // namespace memwall
