#include "profiler/report.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/units.h"

namespace memwall {
namespace {

using Json = nlohmann::json;

Json Categories(const CategoryBytes& bytes) {
  Json out = Json::object();
  for (MemoryCategory c : kAllMemoryCategories) {
    out[std::string(MemoryCategoryName(c))] = bytes[int(c)];
  }
  return out;
}

int64_t Total(const CategoryBytes& bytes) {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("report ", temp, ": cannot be created: ", std::strerror(errno)));
    }
    out << text;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      return absl::DataLossError(absl::StrCat("report ", temp, ": write failed"));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::DataLossError(
        absl::StrCat("report ", path, ": rename failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TerminalReport(const MemoryProfiler& profiler) {
  const PeakSnapshot peak = profiler.peak();
  const CategoryBytes peaks = profiler.category_peaks();
  std::string out = absl::StrFormat(
      "memory profile of %s (capacity %s)\npeak %s requested, %s reserved, in phase '%s'\n",
      profiler.device_name(), FormatBytes(profiler.capacity()), FormatBytes(peak.bytes),
      FormatBytes(peak.reserved), peak.phase.empty() ? "(none)" : peak.phase);
  absl::StrAppendFormat(&out, "  %-24s %12s %7s %14s\n", "category", "at peak", "share",
                        "own peak");
  for (MemoryCategory c : kAllMemoryCategories) {
    const int64_t b = peak.by_category[int(c)];
    if (b == 0 && peaks[int(c)] == 0) continue;
    absl::StrAppendFormat(&out, "  %-24s %12s %6.1f%% %14s\n", MemoryCategoryName(c),
                          FormatBytes(b), peak.bytes ? 100.0 * b / peak.bytes : 0.0,
                          FormatBytes(peaks[int(c)]));
  }
  const int64_t state = ModelStateBytes(peak.by_category);
  const int64_t acts = ActivationBytesOf(peak.by_category);
  absl::StrAppendFormat(&out, "  %-24s %12s %6.1f%%\n", "= model state", FormatBytes(state),
                        peak.bytes ? 100.0 * state / peak.bytes : 0.0);
  absl::StrAppendFormat(&out, "  %-24s %12s %6.1f%%\n", "= activation", FormatBytes(acts),
                        peak.bytes ? 100.0 * acts / peak.bytes : 0.0);
  if (!peak.top_owners.empty()) absl::StrAppend(&out, "top owners at the peak:\n");
  for (const OwnerBytes& o : peak.top_owners) {
    absl::StrAppendFormat(&out, "  %-40s %-16s %12s\n", o.owner.empty() ? "<no owner>" : o.owner,
                          MemoryCategoryName(o.category), FormatBytes(o.bytes));
  }
  return out;
}

Json JsonReport(const MemoryProfiler& profiler) {
  const PeakSnapshot peak = profiler.peak();
  Json report;
  report["schema"] = kProfileSchema;
  report["device"] = profiler.device_name();
  report["capacity"] = profiler.capacity();
  Json p;
  p["bytes"] = peak.bytes;
  p["reserved"] = peak.reserved;
  p["sequence"] = peak.sequence;
  p["phase"] = peak.phase;
  p["by_category"] = Categories(peak.by_category);
  p["model_state"] = ModelStateBytes(peak.by_category);
  p["activation"] = ActivationBytesOf(peak.by_category);
  p["buffers"] = Total(peak.by_category) - ModelStateBytes(peak.by_category) -
                 ActivationBytesOf(peak.by_category);
  p["top_owners"] = Json::array();
  for (const OwnerBytes& o : peak.top_owners) {
    p["top_owners"].push_back(
        {{"owner", o.owner}, {"category", MemoryCategoryName(o.category)}, {"bytes", o.bytes}});
  }
  report["peak"] = p;
  report["category_peaks"] = Categories(profiler.category_peaks());
  report["phases"] = Json::array();
  for (const PhaseRecord& r : profiler.phases()) {
    report["phases"].push_back({{"name", r.name},
                                {"depth", r.depth},
                                {"start_us", r.start_us},
                                {"end_us", r.end_us},
                                {"start_bytes", r.start_bytes},
                                {"end_bytes", r.end_bytes},
                                {"peak_bytes", r.peak_bytes},
                                {"peak_by_category", Categories(r.peak_by_category)}});
  }
  Json points = Json::array();
  for (const TimelinePoint& t : profiler.timeline()) {
    points.push_back({{"t_us", t.time_us},
                      {"sequence", t.sequence},
                      {"reserved", t.reserved},
                      {"by_category", Categories(t.by_category)}});
  }
  report["timeline"] = {{"dropped_events", profiler.dropped_events()}, {"points", points}};
  return report;
}

Json ChromeTrace(const MemoryProfiler& profiler) {
  Json events = Json::array();
  for (const TimelinePoint& t : profiler.timeline()) {
    events.push_back({{"name", "memory (bytes)"},
                      {"ph", "C"},
                      {"ts", t.time_us},
                      {"pid", 0},
                      {"args", Categories(t.by_category)}});
  }
  for (const PhaseRecord& r : profiler.phases()) {
    events.push_back({{"name", r.name},
                      {"ph", "X"},
                      {"ts", r.start_us},
                      {"dur", r.end_us - r.start_us},
                      {"pid", 0},
                      {"tid", 0},
                      {"args", {{"peak_bytes", r.peak_bytes}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

absl::Status WriteReports(const MemoryProfiler& profiler, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("report directory ", dir, ": cannot be created: ", error.message()));
  }
  if (auto s = WriteFile(dir + "/profile.txt", TerminalReport(profiler)); !s.ok()) return s;
  if (auto s = WriteFile(dir + "/profile.json", JsonReport(profiler).dump(1)); !s.ok()) return s;
  return WriteFile(dir + "/trace.json", ChromeTrace(profiler).dump());
}

}  // namespace memwall
