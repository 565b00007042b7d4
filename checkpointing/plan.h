// Activation recomputation: the chain a planner sees, the plans it returns,
// and the exact memory model both share.
//
// A model is a chain of n layers. Layer l keeps, from its forward to its
// backward, `saved` bytes plus its `output` (which the next layer reads);
// its backward allocates an input gradient of `grad_input` bytes that lives
// until the previous layer's backward has run. A plan cuts the chain into
// segments, each in one mode:
//   keep       the segment's layers keep everything (no recomputation);
//   recompute  forward keeps only the segment's last output (the input of
//              the next segment: a checkpoint); each layer's saved bytes and
//              the outputs inside the segment are freed as soon as the next
//              layer has read them. Backward, on reaching the segment, frees
//              that checkpoint and runs the segment's forward again from its
//              input (the previous segment's last output), keeping
//              everything, then runs its backwards: one extra forward;
//   selective  one layer that offers it (Layer::Selective) keeps less and
//              recomputes the rest at the start of its backward;
//   offload    recompute, and the segment's input (the previous layer's
//              output) waits in pinned host memory from the end of the
//              segment's forward until its backward, which copies it back
//              first. Not for a segment starting at layer 0 (the model's
//              input is the batch, not an activation). Its cost adds the
//              copies, priced as FLOPs (Chain::offload_flops_per_byte).
// A layer may be marked not recomputable (a traced PyTorch stage the front
// end cannot run again: the embeddings with the glue around them, the head
// with the loss): recompute, selective and offload segments hold
// recomputable layers only, and every planner keeps the others.
// A plan that recomputes (or offloads) also holds the chain's
// `recompute_held` bytes from the start of forward to the end of backward:
// what a recomputed segment must keep to run again besides its input and
// that nothing else keeps (a traced model's attention mask, which its
// blocks take but autograd does not save), shared by every such segment.
// PredictPeak() replays the engine's allocation order (engine/trainer.cc)
// over these byte counts, so the peak it predicts is the activation peak the
// allocator records for a real step, to the byte (a test checks it).
#ifndef MEMWALL_CHECKPOINTING_PLAN_H_
#define MEMWALL_CHECKPOINTING_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memwall {

struct ChainLayer {
  std::string name;
  int64_t output = 0;       // bytes of its output (kept until its backward)
  int64_t saved = 0;        // bytes it keeps besides its output
  int64_t grad_input = 0;   // bytes of the input gradient its backward allocates
  double forward_flops = 0;
  // Selective mode, when the layer offers it: bytes kept besides the output,
  // bytes allocated again at the start of backward, and their FLOPs.
  bool has_selective = false;
  int64_t selective_saved = 0;
  int64_t selective_recomputed = 0;
  double selective_flops = 0;
  // Whether a segment other than keep may hold it (see the file comment).
  bool recomputable = true;
};

struct Chain {
  std::vector<ChainLayer> layers;
  // The loss's gradient of the last output, allocated after forward.
  int64_t loss_grad = 0;
  // Held by any plan with a recompute or offload segment (see above).
  int64_t recompute_held = 0;
  // What moving one byte between device and host costs, in forward FLOPs
  // (the device's FLOP rate over the host link's bandwidth): offload's
  // price per byte each way.
  double offload_flops_per_byte = 0;
};

enum class SegmentMode { kKeep, kRecompute, kSelective, kOffload };

// "keep", "recompute", "selective", "offload".
const char* SegmentModeName(SegmentMode mode);

struct Segment {
  int begin = 0;  // first layer
  int end = 0;    // one past the last layer
  SegmentMode mode = SegmentMode::kKeep;
};

struct RecomputationPlan {
  std::string planner;  // which planner made it ("none", "sqrt", ...)
  std::vector<Segment> segments;  // in order, covering every layer once
  int64_t predicted_peak = 0;     // activation bytes, see PredictPeak
  int64_t held_after_forward = 0; // activation bytes held once forward ends
  double extra_flops = 0;         // recomputation's forward FLOPs (and
                                  // offload's copies, priced as FLOPs)
  int64_t offloaded_bytes = 0;    // pinned host bytes offload holds at most
};

// kInvalidArgument unless the segments are non-empty, in order, cover
// [0, n) exactly, selective segments are single layers that offer it,
// only keep segments hold layers that are not recomputable, and no
// offload segment starts at layer 0.
absl::Status ValidatePlan(const Chain& chain, const RecomputationPlan& plan);

// What one segment contributes to the memory timeline, relative to the
// bytes `held` before it (by earlier segments) — see the file comment:
//   forward_peak: the most its forward holds at once;
//   held: what it keeps once its forward is done (less, for offload, the
//     input it moved to host: this may be negative);
//   backward_peak: the most held during its backward (recomputation
//     included), counting the gradient of its last output flowing in.
// The step's activation peak is the largest of held-before + forward_peak
// and held-before + backward_peak over the segments, and of all held + the
// loss gradient.
struct SegmentTerms {
  int64_t forward_peak = 0;
  int64_t held = 0;
  int64_t backward_peak = 0;
  double extra_flops = 0;
};
SegmentTerms TermsOf(const Chain& chain, const Segment& segment);

// Whether `plan` has a recompute or offload segment (and so holds the
// chain's recompute_held).
bool Recomputes(const RecomputationPlan& plan);

// The activation peak of one training micro-batch under `plan` (which
// must be valid), and its extra FLOPs.
struct Prediction {
  int64_t peak = 0;
  int64_t held_after_forward = 0;  // what the segments hold for backward
  double extra_flops = 0;
  int64_t offloaded_bytes = 0;
};
Prediction PredictPeak(const Chain& chain, const RecomputationPlan& plan);

// "none: 12 layers kept; peak 1.50 MiB" style one-liners, and the segment
// list ("[0,4) recompute, [4,5) keep, ...").
std::string PlanSummary(const Chain& chain, const RecomputationPlan& plan);

}  // namespace memwall

#endif  // MEMWALL_CHECKPOINTING_PLAN_H_
