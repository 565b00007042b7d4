// The memory profiler's books against the allocator's, phases, and reports.
#include <chrono>
#include <fstream>
#include <map>
#include <random>

#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "profiler/memory_profiler.h"
#include "profiler/report.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

int64_t Sum(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t x : b) t += x;
  return t;
}

TEST_CASE("category totals match the allocator at every event, and the peak to the byte",
          "[profiler]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  // Some memory exists before the profiler: it starts from the books.
  auto early = device->Allocate(12345, MemoryCategory::kParameter, "early").value();
  MemoryProfiler profiler(device->allocator(), /*ring_capacity=*/1000);
  CHECK(Sum(profiler.current()) == 12345);
  std::mt19937 rng(11);
  std::vector<DeviceBuffer> live;
  for (int op = 0; op < 5000; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      auto b = device->Allocate(rng() % 300000, kAllMemoryCategories[rng() % 8],
                                "owner" + std::to_string(rng() % 7));
      if (b.ok()) live.push_back(std::move(b).value());
    } else {
      live.erase(live.begin() + rng() % live.size());
    }
    REQUIRE(Sum(profiler.current()) == device->allocator().stats().requested.current);
    const CategoryBytes current = profiler.current();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      REQUIRE(current[c] == device->allocator().stats().by_category[c].current);
    }
  }
  const PeakSnapshot peak = profiler.peak();
  CHECK(peak.bytes == device->allocator().stats().requested.peak);
  CHECK(Sum(peak.by_category) == peak.bytes);
  CHECK(peak.allocated >= peak.bytes);
  CHECK(peak.reserved >= peak.allocated);
  // Up to 7 owners x 8 categories (+ "early"): the 10 largest, in order.
  REQUIRE(peak.top_owners.size() == MemoryProfiler::kTopOwners);
  int64_t owners = 0;
  for (size_t i = 0; i < peak.top_owners.size(); ++i) {
    owners += peak.top_owners[i].bytes;
    if (i > 0) CHECK(peak.top_owners[i - 1].bytes >= peak.top_owners[i].bytes);
  }
  CHECK(owners <= peak.bytes);
  // The ring kept the last 1000 events and counted the rest.
  CHECK(profiler.timeline().size() == 1000);
  CHECK(profiler.dropped_events() > 0);
}

TEST_CASE("memory declared from outside the allocator joins the books, peaks and phases",
          "[profiler][external]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  MemoryProfiler profiler(device->allocator());
  auto params = device->Allocate(1000, MemoryCategory::kParameter, "fc").value();
  profiler.BeginPhase("forward");
  profiler.RecordExternal(MemoryCategory::kActivation, "fc", 600);
  profiler.RecordExternal(MemoryCategory::kActivation, "act", 400);
  profiler.EndPhase();
  profiler.BeginPhase("backward");
  profiler.RecordExternal(MemoryCategory::kActivation, "act", -400);
  auto grads = device->Allocate(300, MemoryCategory::kGradient, "fc.grad").value();
  profiler.RecordExternal(MemoryCategory::kActivation, "fc", -600);
  profiler.EndPhase();
  // Requested bytes are the allocator's 1300 plus what is declared (none
  // now); the peak, 2000 at the end of forward, was made of both.
  CHECK(Sum(profiler.current()) == 1300);
  CHECK(profiler.current()[int(MemoryCategory::kActivation)] == 0);
  const PeakSnapshot peak = profiler.peak();
  CHECK(peak.bytes == 2000);
  CHECK(peak.phase == "forward");
  CHECK(peak.by_category[int(MemoryCategory::kActivation)] == 1000);
  CHECK(peak.by_category[int(MemoryCategory::kParameter)] == 1000);
  REQUIRE(peak.top_owners.size() == 3);
  CHECK(peak.top_owners[0].owner == "fc");
  CHECK(peak.top_owners[0].category == MemoryCategory::kParameter);
  CHECK(peak.top_owners[1].owner == "fc");
  CHECK(peak.top_owners[1].category == MemoryCategory::kActivation);
  CHECK(peak.top_owners[1].bytes == 600);
  CHECK(peak.allocated >= 1000);  // the allocator's blocks only
  CHECK(peak.allocated < 2000);
  CHECK(profiler.category_peaks()[int(MemoryCategory::kActivation)] == 1000);
  // Live now: the parameters and the gradient; released owners are gone.
  const std::vector<OwnerBytes> owners = profiler.owners();
  REQUIRE(owners.size() == 2);
  CHECK(owners[0].owner == "fc");
  CHECK(owners[0].bytes == 1000);
  CHECK(owners[1].owner == "fc.grad");
  CHECK(owners[1].category == MemoryCategory::kGradient);
  CHECK(owners[1].bytes == 300);
  const std::vector<PhaseRecord> phases = profiler.phases();
  REQUIRE(phases.size() == 2);
  CHECK(phases[0].peak_bytes == 2000);
  CHECK(phases[1].start_bytes == 2000);
  CHECK(phases[1].peak_bytes == 2000);
  CHECK(phases[1].end_bytes == 1300);
}

TEST_CASE("a framework's memory declared alone: the reports name its device and no blocks",
          "[profiler][external]") {
  auto device = CreateDevice({Backend::kMeta, 0, 8 * kGiB}).value();
  MemoryProfiler profiler(device->allocator(), 1 << 10, "cpu");
  profiler.BeginPhase("forward");
  profiler.RecordExternal(MemoryCategory::kParameter, "fc", 3 * kMiB);
  profiler.RecordExternal(MemoryCategory::kActivation, "fc", kMiB);
  profiler.EndPhase();
  CHECK(profiler.device_name() == "cpu");
  CHECK(profiler.peak().bytes == 4 * kMiB);
  CHECK(profiler.peak().reserved == 0);
  const std::string report = TerminalReport(profiler);
  CHECK_THAT(report, Catch::StartsWith(
                         "memory profile of cpu (capacity 8.00 GiB)\n"
                         "peak 4.00 MiB held (the framework's tensors), in phase 'forward'\n"));
  // Without a name the allocator's device is named.
  MemoryProfiler unnamed(device->allocator());
  CHECK(unnamed.device_name() == "meta:0");
}

TEST_CASE("phases nest and know their own peaks", "[profiler]") {
  auto device = CreateDevice({Backend::kMeta, 0, kGiB}).value();
  MemoryProfiler profiler(device->allocator());
  profiler.BeginPhase("step 0");
  profiler.BeginPhase("forward");
  auto a = device->Allocate(100 * kMiB, MemoryCategory::kActivation, "layer0").value();
  profiler.BeginPhase("layer1");
  auto b = device->Allocate(50 * kMiB, MemoryCategory::kActivation, "layer1").value();
  CHECK(profiler.EndPhase());
  CHECK(profiler.EndPhase());
  b.Reset();
  profiler.BeginPhase("backward");
  auto g = device->Allocate(20 * kMiB, MemoryCategory::kGradient, "layer0.grad").value();
  CHECK(profiler.EndPhase());
  CHECK(profiler.EndPhase());
  CHECK_FALSE(profiler.EndPhase());
  const std::vector<PhaseRecord> phases = profiler.phases();
  REQUIRE(phases.size() == 4);
  CHECK(phases[0].name == "layer1");
  CHECK(phases[0].depth == 2);
  CHECK(phases[0].peak_bytes == 150 * kMiB);
  CHECK(phases[1].name == "forward");
  CHECK(phases[1].peak_bytes == 150 * kMiB);
  CHECK(phases[2].name == "backward");
  CHECK(phases[2].start_bytes == 100 * kMiB);
  CHECK(phases[2].peak_bytes == 120 * kMiB);
  CHECK(phases[3].name == "step 0");
  const PeakSnapshot peak = profiler.peak();
  CHECK(peak.bytes == 150 * kMiB);
  CHECK(peak.phase == "layer1");
  // Meta rounds like a GPU: 100 MiB and 50 MiB are whole blocks already.
  CHECK(peak.allocated == 150 * kMiB);
  CHECK(peak.phase_path == std::vector<std::string>{"step 0", "forward", "layer1"});
  CHECK(profiler.category_peaks()[int(MemoryCategory::kActivation)] == 150 * kMiB);
  CHECK(profiler.category_peaks()[int(MemoryCategory::kGradient)] == 20 * kMiB);
}

TEST_CASE("activities go on tracks of their own in the reports", "[profiler]") {
  auto device = CreateDevice({Backend::kMeta, 0, kGiB}).value();
  MemoryProfiler profiler(device->allocator(), /*ring_capacity=*/3);
  const auto at = [](int us) {
    return std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  };
  profiler.BeginPhase("backward");
  profiler.RecordActivity("cpu update", "update block1", at(0), at(500));
  profiler.RecordActivity("nvme read", "4.00 KiB", at(100), at(200), 4096);
  CHECK(profiler.EndPhase());
  { ScopedActivity update(&profiler, "cpu update", "update block0"); }
  ScopedActivity off(nullptr, "cpu update", "not recorded");
  std::vector<ActivityRecord> a = profiler.activities();
  REQUIRE(a.size() == 3);
  CHECK(a[0].track == "cpu update");
  CHECK(a[0].name == "update block1");
  CHECK(a[0].end_us - a[0].start_us == Approx(500).margin(50));
  CHECK(a[1].bytes == 4096);
  CHECK(a[2].name == "update block0");
  CHECK(a[2].end_us >= a[2].start_us);

  const nlohmann::json trace = ChromeTrace(profiler);
  std::map<int, std::string> threads;
  std::vector<nlohmann::json> slices;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") threads[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("ph") == "X") slices.push_back(e);
  }
  CHECK(threads == std::map<int, std::string>{{0, "engine"}, {1, "cpu update"}, {2, "nvme read"}});
  REQUIRE(slices.size() == 4);
  CHECK(slices[0].at("name") == "backward");
  CHECK(slices[0].at("tid") == 0);
  CHECK(slices[1].at("tid") == 1);
  CHECK(slices[2].at("tid") == 2);
  CHECK(slices[2].at("args").at("bytes") == 4096);
  CHECK(slices[3].at("tid") == 1);
  CHECK(slices[3].at("name") == "update block0");

  // The ring keeps the last activities and counts the dropped ones.
  profiler.RecordActivity("nvme write", "4.00 KiB", at(0), at(10), 4096);
  a = profiler.activities();
  REQUIRE(a.size() == 3);
  CHECK(a[0].name == "4.00 KiB");
  CHECK(profiler.dropped_activities() == 1);
  const nlohmann::json report = JsonReport(profiler);
  CHECK(report.at("activities").at("dropped") == 1);
  CHECK(report.at("activities").at("records").at(2).at("track") == "nvme write");
  CHECK(report.at("activities").at("records").at(2).at("bytes") == 4096);
}

// The keys and types of schema memwall.profile/1 (profiler/report.h).
void CheckSchema(const nlohmann::json& r) {
  REQUIRE(r.at("schema") == kProfileSchema);
  REQUIRE(r.at("device").is_string());
  REQUIRE(r.at("capacity").is_number_integer());
  const auto& p = r.at("peak");
  for (const char* key :
       {"bytes", "allocated", "reserved", "sequence", "model_state", "activation", "buffers"}) {
    INFO(key);
    REQUIRE(p.at(key).is_number_integer());
  }
  REQUIRE(p.at("phase").is_string());
  REQUIRE(p.at("phase_path").is_array());
  for (MemoryCategory c : kAllMemoryCategories) {
    REQUIRE(p.at("by_category").at(std::string(MemoryCategoryName(c))).is_number_integer());
    REQUIRE(r.at("category_peaks").at(std::string(MemoryCategoryName(c))).is_number_integer());
  }
  for (const auto& o : p.at("top_owners")) {
    REQUIRE(o.at("owner").is_string());
    REQUIRE(o.at("category").is_string());
    REQUIRE(o.at("bytes").is_number_integer());
  }
  for (const auto& ph : r.at("phases")) {
    for (const char* key : {"name", "depth", "start_us", "end_us", "start_bytes", "end_bytes",
                            "peak_bytes", "peak_by_category"}) {
      INFO(key);
      REQUIRE(ph.contains(key));
    }
  }
  REQUIRE(r.at("timeline").at("dropped_events").is_number_integer());
  REQUIRE(r.at("activities").at("dropped").is_number_integer());
  for (const auto& a : r.at("activities").at("records")) {
    for (const char* key : {"track", "name", "start_us", "end_us", "bytes"}) {
      INFO(key);
      REQUIRE(a.contains(key));
    }
  }
  for (const auto& t : r.at("timeline").at("points")) {
    REQUIRE(t.at("by_category").is_object());
    REQUIRE(t.at("t_us").is_number());
  }
}

TEST_CASE("a real gpt-tiny step: exact peak, attribution and reports", "[profiler][gpt]") {
  auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  MemoryProfiler profiler(device->allocator());
  const GptConfig c = GptPreset("gpt-tiny").value();
  ShardingOptions options;
  options.zero.stage = 3;
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                 options, *device, *comm, 1).value();
  trainer->set_profiler(&profiler);
  Batch b;
  b.input = Tensor::Empty(*device, DType::kF32, {4, c.seq}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(*device, DType::kF32, {4 * c.seq}, MemoryCategory::kOther, "data").value();
  for (int64_t i = 0; i < b.input.numel(); ++i) {
    b.input.data_as<float>()[i] = float(i % 256);
    b.target.data_as<float>()[i] = float((i + 1) % 256);
  }
  REQUIRE(trainer->TrainStep({&b, 1}).ok());
  const PeakSnapshot peak = profiler.peak();
  CHECK(peak.bytes == device->allocator().stats().requested.peak);
  CHECK(Sum(peak.by_category) == peak.bytes);
  // The peak falls in backward (the saved activations plus the backward's
  // workspace), where activations are gpt-tiny's largest category.
  CHECK(std::find(peak.phase_path.begin(), peak.phase_path.end(), "backward") !=
        peak.phase_path.end());
  const int64_t activations = ActivationBytesOf(peak.by_category);
  for (MemoryCategory c : kAllMemoryCategories) {
    if (c != MemoryCategory::kActivation) CHECK(peak.by_category[static_cast<int>(c)] < activations);
  }
  CHECK(peak.by_category[static_cast<int>(MemoryCategory::kWorkspace)] > 0);
  std::vector<std::string> names;
  for (const PhaseRecord& p : profiler.phases()) names.push_back(p.name);
  CHECK(std::find(names.begin(), names.end(), "step 0") != names.end());
  CHECK(std::find(names.begin(), names.end(), "forward") != names.end());
  CHECK(std::find(names.begin(), names.end(), "optimizer step") != names.end());

  const nlohmann::json report = JsonReport(profiler);
  CheckSchema(report);
  const nlohmann::json again = nlohmann::json::parse(report.dump());
  CheckSchema(again);
  CHECK(again.at("peak").at("bytes") == peak.bytes);
  CHECK(again.at("peak").at("model_state") == ModelStateBytes(peak.by_category));
  CHECK(again.at("peak").at("activation") == ActivationBytesOf(peak.by_category));

  const nlohmann::json trace = nlohmann::json::parse(ChromeTrace(profiler).dump());
  int counters = 0, slices = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "C") ++counters;
    if (e.at("ph") == "X") ++slices;
  }
  CHECK(counters == static_cast<int>(profiler.timeline().size()));
  CHECK(slices == static_cast<int>(profiler.phases().size()));

  const std::string text = TerminalReport(profiler);
  CHECK_THAT(text, Catch::Contains("memory profile of host:0 (capacity 256.00 MiB)"));
  CHECK_THAT(text, Catch::Contains("= model state"));

  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/memwall_profile";
  REQUIRE(WriteReports(profiler, dir).ok());
  std::ifstream json_file(dir + "/profile.json");
  CheckSchema(nlohmann::json::parse(json_file));
  const absl::Status bad = WriteReports(profiler, "/proc/memwall/cannot");
  CHECK_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.message()), Catch::StartsWith("report directory /proc/memwall/cannot"));
}

}  // namespace
}  // namespace memwall
