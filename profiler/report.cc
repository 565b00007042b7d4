#include "profiler/report.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

// Text for HTML: names come from models and users.
std::string Escape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string TerminalReport(const MemoryProfiler& profiler) {
  const PeakSnapshot peak = profiler.peak();
  const CategoryBytes peaks = profiler.category_peaks();
  const std::string phase =
      peak.phase_path.empty() ? "(none)" : absl::StrJoin(peak.phase_path, " > ");
  std::string out = absl::StrFormat("memory profile of %s (capacity %s)\n",
                                    profiler.device_name(), FormatBytes(profiler.capacity()));
  if (peak.reserved == 0 && peak.bytes > 0) {
    // Every byte was declared (a framework's tensors): memwall's allocator
    // reserved nothing, so it has no blocks or cache to report.
    absl::StrAppendFormat(&out, "peak %s held (the framework's tensors), in phase '%s'\n",
                          FormatBytes(peak.bytes), phase);
  } else {
    absl::StrAppendFormat(
        &out, "peak %s requested, %s in blocks, %s reserved (%s cached or fragmented), in phase "
        "'%s'\n",
        FormatBytes(peak.bytes), FormatBytes(peak.allocated), FormatBytes(peak.reserved),
        FormatBytes(peak.reserved - peak.allocated), phase);
  }
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
  p["allocated"] = peak.allocated;
  p["sequence"] = peak.sequence;
  p["phase"] = peak.phase;
  p["phase_path"] = peak.phase_path;
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
  Json records = Json::array();
  for (const ActivityRecord& a : profiler.activities()) {
    records.push_back({{"track", a.track},
                       {"name", a.name},
                       {"start_us", a.start_us},
                       {"end_us", a.end_us},
                       {"bytes", a.bytes}});
  }
  report["activities"] = {{"dropped", profiler.dropped_activities()}, {"records", records}};
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
  const auto thread_name = [&](int tid, const std::string& name) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
  };
  thread_name(0, "engine");
  std::map<std::string, int> tracks;
  for (const ActivityRecord& a : profiler.activities()) {
    auto [it, added] = tracks.try_emplace(a.track, static_cast<int>(tracks.size()) + 1);
    if (added) thread_name(it->second, a.track);
    events.push_back({{"name", a.name},
                      {"ph", "X"},
                      {"ts", a.start_us},
                      {"dur", a.end_us - a.start_us},
                      {"pid", 0},
                      {"tid", it->second},
                      {"args", {{"bytes", a.bytes}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

std::string HtmlReport(const MemoryProfiler& profiler) {
  static const char* const kColors[kNumMemoryCategories] = {
      "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  constexpr double kWidth = 900, kHeight = 320, kLeft = 70, kTop = 20;
  const std::vector<TimelinePoint> points = profiler.timeline();
  const PeakSnapshot peak = profiler.peak();
  int64_t top = 1;
  for (const TimelinePoint& t : points) top = std::max(top, Total(t.by_category));
  const double x_scale = points.size() > 1 ? kWidth / double(points.size() - 1) : 0.0;
  auto x = [&](size_t i) { return kLeft + i * x_scale; };
  auto y = [&](int64_t bytes) { return kTop + kHeight - kHeight * double(bytes) / double(top); };
  std::string svg = absl::StrFormat(
      "<svg id=\"memory-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\">\n",
      kLeft + kWidth + 20, kTop + kHeight + 90);
  // Stacked areas, bottom category first.
  std::vector<int64_t> below(points.size(), 0);
  for (MemoryCategory c : kAllMemoryCategories) {
    bool any = false;
    for (const TimelinePoint& t : points) any = any || t.by_category[int(c)] != 0;
    if (!any) continue;
    std::string upper, lower;
    for (size_t i = 0; i < points.size(); ++i) {
      absl::StrAppendFormat(&upper, "%.1f,%.1f ", x(i), y(below[i] + points[i].by_category[int(c)]));
    }
    for (size_t i = points.size(); i-- > 0;) {
      absl::StrAppendFormat(&lower, "%.1f,%.1f ", x(i), y(below[i]));
      below[i] += points[i].by_category[int(c)];
    }
    absl::StrAppendFormat(&svg,
                          "<polygon class=\"area\" data-category=\"%s\" fill=\"%s\" "
                          "fill-opacity=\"0.85\" points=\"%s%s\"/>\n",
                          MemoryCategoryName(c), kColors[int(c)], upper, lower);
  }
  // The peak: the first recorded point at the peak bytes.
  for (size_t i = 0; i < points.size(); ++i) {
    if (Total(points[i].by_category) != peak.bytes) continue;
    absl::StrAppendFormat(&svg,
                          "<line id=\"peak-marker\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" "
                          "y2=\"%.1f\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">peak %s</text>\n",
                          x(i), x(i), kTop, kTop + kHeight, x(i) + 4, kTop + 12,
                          FormatBytes(peak.bytes));
    break;
  }
  // Axis labels.
  absl::StrAppendFormat(&svg,
                        "<text x=\"4\" y=\"%.1f\" font-size=\"11\">%s</text>\n"
                        "<text x=\"4\" y=\"%.1f\" font-size=\"11\">0</text>\n",
                        kTop + 10, FormatBytes(top), kTop + kHeight);
  // Top-level phases as bands under the plot, placed by the sequence range
  // of the recorded points inside them.
  int band = 0;
  for (const PhaseRecord& p : profiler.phases()) {
    if (p.depth != 0) continue;
    size_t first = points.size(), last = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].time_us >= p.start_us && points[i].time_us <= p.end_us) {
        first = std::min(first, i);
        last = std::max(last, i);
      }
    }
    if (first > last) continue;
    const double bx = x(first), bw = std::max(2.0, x(last) - x(first));
    const double by = kTop + kHeight + 10 + 22 * (band++ % 3);
    absl::StrAppendFormat(&svg,
                          "<rect class=\"phase\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                          "height=\"18\" fill=\"#ddd\" stroke=\"#999\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">%s</text>\n",
                          bx, by, bw, bx + 3, by + 13, Escape(p.name));
  }
  absl::StrAppend(&svg, "</svg>\n");

  std::string rows;
  for (MemoryCategory c : kAllMemoryCategories) {
    const int64_t b = peak.by_category[int(c)];
    if (b == 0) continue;
    absl::StrAppendFormat(&rows,
                          "<tr><td><span style=\"color:%s\">&#9632;</span> %s</td>"
                          "<td>%s</td><td>%.1f%%</td></tr>\n",
                          kColors[int(c)], MemoryCategoryName(c), FormatBytes(b),
                          peak.bytes ? 100.0 * b / peak.bytes : 0.0);
  }
  return absl::StrFormat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>memwall memory profile: "
      "%s</title>\n<style>body{font-family:sans-serif;margin:20px}td{padding:2px 10px}"
      "</style></head><body>\n<h1>Memory profile of %s</h1>\n<p>Peak %s requested (%s "
      "reserved) in phase <b>%s</b>: model state %s, activation %s.</p>\n%s"
      "<table id=\"peak-breakdown\"><tr><th>category</th><th>at peak</th><th>share</th>"
      "</tr>\n%s</table>\n</body></html>\n",
      Escape(profiler.device_name()), Escape(profiler.device_name()), FormatBytes(peak.bytes),
      FormatBytes(peak.reserved), peak.phase.empty() ? "(none)" : Escape(peak.phase),
      FormatBytes(ModelStateBytes(peak.by_category)),
      FormatBytes(ActivationBytesOf(peak.by_category)), svg, rows);
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
  if (auto s = WriteFile(dir + "/trace.json", ChromeTrace(profiler).dump()); !s.ok()) return s;
  return WriteFile(dir + "/profile.html", HtmlReport(profiler));
}

absl::Status ReportOutOfMemory(absl::Status status, const MemoryProfiler& profiler,
                               const std::string& dir) {
  if (status.ok() || !absl::IsResourceExhausted(status)) return status;
  const absl::Status written = WriteReports(profiler, dir);
  return absl::ResourceExhaustedError(absl::StrCat(
      status.message(),
      written.ok()
          ? absl::StrCat(". Memory reports of this moment: ", dir, "/profile.{txt,json,html}")
          : absl::StrCat(". (Writing the reports failed too: ", written.message(), ")")));
}

}  // namespace memwall
