// Reports of a MemoryProfiler: a terminal table, JSON with a versioned
// schema (for scripts), and Chrome trace event format (Perfetto,
// chrome://tracing).
//
// JSON schema "memwall.profile/1" (all byte counts are integers):
//   schema        "memwall.profile/1"
//   device        "host:0";  capacity  bytes
//   peak          {bytes, allocated (block bytes), reserved, sequence, phase,
//                  phase_path: [outermost first],
//                  by_category: {parameter, gradient, optimizer_state,
//                                activation, checkpointed_activation,
//                                workspace, comm_buffer, other},
//                  model_state   (parameter + gradient + optimizer_state),
//                  activation    (activation + checkpointed_activation),
//                  buffers       (workspace + comm_buffer + other),
//                  top_owners: [{owner, category, bytes}], largest first}
//   category_peaks  {<category>: bytes}, each category's own maximum
//   phases        [{name, depth, start_us, end_us, start_bytes, end_bytes,
//                   peak_bytes, peak_by_category: {<category>: bytes}}]
//   timeline      {dropped_events, points: [{t_us, sequence, reserved,
//                   by_category: {<category>: bytes}}]}
//   activities    {dropped, records: [{track, name, start_us, end_us, bytes}]}
//                 (work beside the engine's thread: "cpu update",
//                 "nvme read", "nvme write"), added in the same version
//
// The Chrome trace puts the phases on thread 0 ("engine") and each
// activity track on a thread of its own, named after the track, in order
// of first appearance; the memory counter is the process's.
#ifndef MEMWALL_PROFILER_REPORT_H_
#define MEMWALL_PROFILER_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "profiler/memory_profiler.h"

namespace memwall {

inline constexpr char kProfileSchema[] = "memwall.profile/1";

std::string TerminalReport(const MemoryProfiler& profiler);
nlohmann::json JsonReport(const MemoryProfiler& profiler);
nlohmann::json ChromeTrace(const MemoryProfiler& profiler);
// A self-contained HTML page (no scripts, no network): an SVG stacked-area
// plot of bytes by category over the recorded events, the peak marked
// (#peak-marker) with its breakdown, and the top-level phases as labelled
// bands under the plot.
std::string HtmlReport(const MemoryProfiler& profiler);

// Writes profile.txt, profile.json, trace.json and profile.html into `dir` (created if
// missing). Each file is written to a temporary name and renamed, so a
// failure leaves no half-written report; errors name the file.
absl::Status WriteReports(const MemoryProfiler& profiler, const std::string& dir);

// If `status` is out of memory, writes the reports of this moment to `dir`
// and returns the status with a pointer to them appended; otherwise returns
// `status` unchanged.
absl::Status ReportOutOfMemory(absl::Status status, const MemoryProfiler& profiler,
                               const std::string& dir);

}  // namespace memwall

#endif  // MEMWALL_PROFILER_REPORT_H_
