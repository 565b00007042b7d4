#include "checkpointing/plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/units.h"

namespace memwall {

const char* SegmentModeName(SegmentMode mode) {
  switch (mode) {
    case SegmentMode::kKeep: return "keep";
    case SegmentMode::kRecompute: return "recompute";
    case SegmentMode::kSelective: return "selective";
    case SegmentMode::kOffload: return "offload";
  }
  return "unknown";
}

absl::Status ValidatePlan(const Chain& chain, const RecomputationPlan& plan) {
  const int n = static_cast<int>(chain.layers.size());
  int next = 0;
  for (size_t k = 0; k < plan.segments.size(); ++k) {
    const Segment& s = plan.segments[k];
    if (s.begin != next || s.end <= s.begin || s.end > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan '", plan.planner, "': segment ", k, " is [", s.begin, ", ", s.end,
          "); expected a non-empty segment starting at layer ", next, " and ending by ", n));
    }
    if (s.mode == SegmentMode::kSelective &&
        (s.end != s.begin + 1 || !chain.layers[s.begin].has_selective)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan '", plan.planner, "': segment ", k, " is selective; expected a single layer "
          "that offers selective recomputation (layer '", chain.layers[s.begin].name, "'",
          chain.layers[s.begin].has_selective ? "" : " does not", ")"));
    }
    if (s.mode != SegmentMode::kKeep) {
      for (int l = s.begin; l < s.end; ++l) {
        if (chain.layers[l].recomputable) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "plan '", plan.planner, "': segment ", k, " is ", SegmentModeName(s.mode),
            "; layer '", chain.layers[l].name, "' in it cannot be recomputed (keep it)"));
      }
    }
    if (s.mode == SegmentMode::kOffload && s.begin == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan '", plan.planner, "': segment ", k,
          " offloads its input, which at layer 0 is the batch, not an activation"));
    }
    next = s.end;
  }
  if (next != n) {
    return absl::InvalidArgumentError(absl::StrCat("plan '", plan.planner, "': covers layers 0..",
                                                   next - 1, " of 0..", n - 1));
  }
  return absl::OkStatus();
}

SegmentTerms TermsOf(const Chain& chain, const Segment& seg) {
  const std::vector<ChainLayer>& layers = chain.layers;
  const int n = static_cast<int>(layers.size());
  SegmentTerms t;
  const int64_t grad_in = seg.end == n ? chain.loss_grad : layers[seg.end].grad_input;
  auto kept = [&](int l) { return layers[l].saved + layers[l].output; };

  // Forward (bytes relative to what earlier segments hold).
  int64_t cur = 0, peak = 0;
  switch (seg.mode) {
    case SegmentMode::kKeep:
      for (int l = seg.begin; l < seg.end; ++l) cur += kept(l);
      peak = cur;
      break;
    case SegmentMode::kSelective:
      cur = layers[seg.begin].selective_saved + layers[seg.begin].output;
      peak = cur;
      t.extra_flops = layers[seg.begin].selective_flops;
      break;
    case SegmentMode::kRecompute:
    case SegmentMode::kOffload:
      for (int l = seg.begin; l < seg.end; ++l) {
        cur += kept(l);
        peak = std::max(peak, cur);
        cur -= layers[l].saved;                          // dropped after its forward
        if (l > seg.begin) cur -= layers[l - 1].output;  // read by layer l, not kept
        t.extra_flops += layers[l].forward_flops;
      }
      break;
  }
  t.forward_peak = peak;
  t.held = cur;
  const int64_t moved = seg.mode == SegmentMode::kOffload ? layers[seg.begin - 1].output : 0;
  t.held -= moved;  // the input, now on host
  t.extra_flops += 2.0 * moved * chain.offload_flops_per_byte;

  // Backward: the segment's bytes plus the gradient of its last output.
  cur = t.held + grad_in;
  peak = cur;
  cur += moved;  // offload: the input comes back first
  peak = std::max(peak, cur);
  if (seg.mode == SegmentMode::kRecompute || seg.mode == SegmentMode::kOffload) {
    cur -= layers[seg.end - 1].output;  // the checkpoint, recomputed with the rest
    for (int l = seg.begin; l < seg.end; ++l) cur += kept(l);
    peak = std::max(peak, cur);
  }
  int64_t grad = grad_in;
  for (int l = seg.end - 1; l >= seg.begin; --l) {
    if (seg.mode == SegmentMode::kSelective) cur += layers[l].selective_recomputed;
    cur += layers[l].grad_input;
    peak = std::max(peak, cur);
    cur -= seg.mode == SegmentMode::kSelective
               ? layers[l].selective_saved + layers[l].selective_recomputed + layers[l].output
               : kept(l);
    cur -= grad;
    grad = layers[l].grad_input;
  }
  t.backward_peak = peak;
  return t;
}

bool Recomputes(const RecomputationPlan& plan) {
  for (const Segment& s : plan.segments) {
    if (s.mode == SegmentMode::kRecompute || s.mode == SegmentMode::kOffload) return true;
  }
  return false;
}

Prediction PredictPeak(const Chain& chain, const RecomputationPlan& plan) {
  Prediction p;
  std::vector<SegmentTerms> terms;
  const int64_t shared = Recomputes(plan) ? chain.recompute_held : 0;
  int64_t held = shared;
  for (const Segment& s : plan.segments) {
    terms.push_back(TermsOf(chain, s));
    p.peak = std::max(p.peak, held + terms.back().forward_peak);
    held += terms.back().held;
    p.extra_flops += terms.back().extra_flops;
    if (s.mode == SegmentMode::kOffload) p.offloaded_bytes += chain.layers[s.begin - 1].output;
  }
  p.held_after_forward = held;
  p.peak = std::max(p.peak, held + chain.loss_grad);
  for (size_t k = terms.size(); k-- > 0;) {
    held -= terms[k].held;
    p.peak = std::max(p.peak, held + terms[k].backward_peak);
  }
  return p;
}

std::string PlanSummary(const Chain& chain, const RecomputationPlan& plan) {
  int counts[4] = {0, 0, 0, 0};
  for (const Segment& s : plan.segments) counts[static_cast<int>(s.mode)] += s.end - s.begin;
  // Runs of single-layer segments in one mode print as one range.
  std::vector<std::string> parts;
  for (size_t k = 0; k < plan.segments.size();) {
    const Segment& s = plan.segments[k];
    size_t run = k + 1;
    while (s.end - s.begin == 1 && run < plan.segments.size() &&
           plan.segments[run].mode == s.mode &&
           plan.segments[run].end - plan.segments[run].begin == 1) {
      ++run;
    }
    const int end = plan.segments[run - 1].end;
    parts.push_back(absl::StrCat("[", s.begin, ",", end, ") ", SegmentModeName(s.mode),
                                 run - k > 1 && s.mode != SegmentMode::kKeep ? " per layer" : ""));
    k = run;
  }
  double forward = 0;
  for (const ChainLayer& l : chain.layers) forward += l.forward_flops;
  return absl::StrCat(plan.planner, ": ", counts[0], " layers kept, ", counts[1],
                      " recomputed, ", counts[2], " selective",
                      counts[3] > 0 ? absl::StrCat(", ", counts[3], " recomputed with their input on host (",
                                                   FormatBytes(plan.offloaded_bytes), ")")
                                    : "",
                      " in ", plan.segments.size(),
                      " segments; activation peak ", FormatBytes(plan.predicted_peak),
                      ", extra forward FLOPs ",
                      forward > 0 ? absl::StrFormat("%.1f%%", 100.0 * plan.extra_flops / forward)
                                  : std::string("0%"),
                      "\n  ", absl::StrJoin(parts, ", "));
}

}  // namespace memwall
