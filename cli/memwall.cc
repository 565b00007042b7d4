// The `memwall` command: train, profile, plan, export, launch, demo,
// tune-aio.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/demo.h"
#include "cli/train.h"
#include "engine/checkpoint.h"
#include "engine/progress.h"
#include "engine/version.h"
#include "jobs/profile.h"
#include "kernels/cpu/blas_core.h"
#include "nlohmann/json.hpp"
#include "offload/aio_tune.h"
#include "planning/max_params.h"
#include "planning/plan.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

ABSL_FLAG(std::string, backend, "",
          "Device backend: host (host RAM posing as a device with an enforced capacity), cuda "
          "(train and profile: one GPU per rank, NCCL between ranks) or meta (accounting only: "
          "no bytes, any size). Default: meta for profile, host otherwise.");
ABSL_FLAG(std::string, device_memory, "",
          "Device capacity per rank, e.g. 256MiB, 32GiB or 32GB (binary and decimal units); "
          "default 256MiB, 32GiB for plan and max-params; with --backend cuda the GPU's free memory less 1 GiB "
          "for the CUDA runtime.");
ABSL_FLAG(std::string, pinned_memory, "0",
          "train, profile: pinned host memory per rank for offloaded optimizer states "
          "(zero_optimization.offload_optimizer) and activations "
          "(activation_checkpointing.offload); 0 = 64GiB with optimizer offload, as much as "
          "--device_memory with activation offload, none otherwise.");
ABSL_FLAG(std::string, params, "8388608",
          "demo: parameters of the toy model (a count; 1e9 style is accepted).");
ABSL_FLAG(std::string, model, "gpt-tiny",
          "train: the model, a GPT preset: gpt-tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, "
          "gpt3-6.7b, gpt3-13b, gpt3-175b; overrides after a colon: gpt2-124m:layers=2,seq=256 "
          "(keys vocab, seq, hidden, heads, layers; tiles=K computes each block weight in K "
          "tiles of columns, vocab_tiles=K the tied embedding and LM head in K tiles of the "
          "vocabulary; frozen_blocks=N freezes the first N blocks), or gpt:params=N. "
          "max-params: the family, gpt (default), gpt:seq=N,vocab=N,layers=N, or hf:PATH "
          "(scaled in depth).");
ABSL_FLAG(std::string, config, "",
          "train: a DeepSpeed-style JSON config file; empty uses the built-in ZeRO-2 config "
          "(configs/gpt-tiny-zero2.json). max-params: the precision, optimizer and micro-batch "
          "to keep; empty: bf16 AdamW, micro-batch 1.");
ABSL_FLAG(int64_t, steps, 100,
          "train, profile: optimizer steps to run (when not given: 100 for train, 1 for "
          "profile); train --steps 0 --save DIR saves the initial weights.");
ABSL_FLAG(std::string, data, "",
          "train: a text file to train on, byte-level; empty uses a built-in synthetic corpus.");
ABSL_FLAG(uint64_t, seed, 1, "train: seed of the parameter initialisation.");
ABSL_FLAG(int64_t, log_every, 10, "train: print progress every this many steps.");
ABSL_FLAG(std::string, log_format, "text",
          "train: text (lines for people) or json (one JSON object per line: events start, "
          "resumed, step, saved, nothing_to_train, summary; bytes and tokens/s).");
ABSL_FLAG(std::string, save, "",
          "train: save training checkpoints into this directory (at the end, and every "
          "--save_every steps).");
ABSL_FLAG(int64_t, save_every, 0, "train: with --save, also save every this many steps (0: only at the end).");
ABSL_FLAG(int, keep_checkpoints, 3, "train: with --save, keep the newest this many checkpoints.");
ABSL_FLAG(std::string, checkpoint, "", "export: a checkpoint directory (or a --save directory).");
ABSL_FLAG(std::string, dtype, "f32", "export: f32 or bf16.");
ABSL_FLAG(bool, force, false,
          "export, plan --auto, max-params, tune-aio: replace an existing --out file (never a "
          "checkpoint's).");
ABSL_FLAG(std::string, resume, "",
          "train: resume from the newest complete checkpoint in this directory (any number of "
          "ranks and any ZeRO stage may have saved it); --steps is the step to train up to.");
ABSL_FLAG(double, collective_timeout, 600,
          "train, profile: seconds a rank waits for the others in one collective before the "
          "job ends with an error naming the ranks that never arrived (a rank crashed, hangs or "
          "stopped calling collectives); 0 waits forever.");
ABSL_FLAG(int, simulate_ranks, 1,
          "train, profile, demo with --backend meta: the number of ranks the single process "
          "plays rank 0 of.");
ABSL_FLAG(int, ranks, 2, "launch: the number of MPI ranks (processes) to start.");
ABSL_FLAG(std::string, out, "",
          "profile: the folder for the reports (default memwall-profile); train: where out of "
          "memory writes them (default memwall-oom); plan --auto, max-params: where the chosen "
          "config is written; export: the safetensors file; tune-aio: the aio block.");
ABSL_FLAG(int64_t, batch, 0, "profile, plan, max-params: micro-batch size; 0 uses the config's.");
ABSL_FLAG(int64_t, seq, 0,
          "profile, plan, max-params: sequence length of a transformer; 0 uses the model's "
          "(max-params: 1024).");
ABSL_FLAG(int64_t, image, 224, "profile, plan: image size of a CNN (square inputs).");
ABSL_FLAG(int64_t, gpus, 1,
          "plan, max-params: the data-parallel world N (the plan is rank 0's).");
ABSL_FLAG(std::string, host_memory, "512GiB", "plan, max-params: pinned host memory per GPU.");
ABSL_FLAG(std::string, nvme, "0", "plan, max-params: NVMe space per GPU (0: none).");
ABSL_FLAG(bool, json, false,
          "plan, max-params: print the report as JSON (schema memwall.plan/1, "
          "memwall.max-params/1).");
ABSL_FLAG(bool, auto, false,
          "plan: search stage, offload, paging, NVMe, recomputation and the micro-batch "
          "(keeping micro-batch x accumulation) for the fastest "
          "configuration that fits, and print it as a config file (also when the config's "
          "zero_optimization.stage is \"auto\").");
ABSL_FLAG(std::string, attention, "auto",
          "plan --model hf:PATH: the attention kernel the trace accounts: auto (what torch picks "
          "on a GPU: flash for 16-bit without a mask, else efficient), flash, efficient, math.");
ABSL_FLAG(int64_t, lora_rank, 0,
          "plan --model hf:PATH: LoRA fine-tuning with adapters of this rank on --lora_targets, "
          "the base model frozen (0: full fine-tuning).");
ABSL_FLAG(std::string, lora_targets, "q_proj,v_proj",
          "plan --model hf:PATH: the linear layers (attribute names) --lora_rank adapts.");
ABSL_FLAG(std::string, dir, "", "tune-aio: a directory on the file system to measure.");
ABSL_FLAG(std::string, bytes, "512MiB", "tune-aio: the bytes of the measured slot.");
ABSL_FLAG(int, buffer_count, 4, "tune-aio: the buffers chunks stream through.");
ABSL_FLAG(int, repeats, 2, "tune-aio: runs of each measurement (the best counts).");
ABSL_FLAG(int64_t, gpus_per_node, 0,
          "plan: GPUs per node, what the link bytes count as inside or across nodes (0: the "
          "config's ranks_per_node, else the hardware profile's: 8 for the GPU presets, one node "
          "for this-machine).");
ABSL_FLAG(double, inter_node_gbit, 0,
          "plan: each GPU's bandwidth across nodes in Gb/s, for the step-time model (0: the "
          "hardware profile's: 50 for v100-32gb, 200 for the A100s, 400 for h100-80gb and "
          "h200).");
ABSL_FLAG(std::string, hardware, "",
          "plan: the step-time model's hardware (plan prints the predicted step time; --auto ranks by it): v100-32gb, a100-40gb, a100-80gb, "
          "h100-80gb, h200, or this-machine (measured now; plans the host backend, with no CUDA "
          "runtime allowance); empty picks by --device_memory.");

namespace {

constexpr char kUsage[] = R"(break the memory wall of large-model training.

usage:
  memwall train [--model gpt-tiny] [--config FILE] [--steps N] [--data FILE]
                [--backend host|cuda|meta] [--device_memory SIZE] [--seed S]
                [--pinned_memory SIZE]
                [--log_every N] [--log_format text|json] [--simulate_ranks N]
                [--out DIR]
                [--save DIR [--save_every N] [--keep_checkpoints K]] [--resume DIR]
                [--collective_timeout SECONDS]
      Trains a GPT (byte-level text) with ZeRO sharding across the MPI ranks
      it was launched on, printing loss, tokens/s and peak device memory by
      category, then a summary (--log_format json: one JSON object per line
      instead, for programs). Out of memory writes the memory reports of
      that moment to DIR/rank<k>/ (default memwall-oom). On 2 ranks:
        memwall launch --ranks 2 -- memwall train --steps 100
      The config's activation_checkpointing.planner (none, full,
      uniform:K, sqrt, selective, optimal; engine/config.h) picks which
      activations are recomputed in backward; optimal fits the least
      recomputation into budget_bytes, or into the device memory left by
      the rest of a step (measured by a dry run on meta), and with
      "offload": true may also keep segment inputs in pinned host memory
      (--pinned_memory). The plan and its predicted activation peak are
      printed.
      With zero_optimization.offload_optimizer {"device": "cpu"} (stages
      1-3, optional "ratio") the optimizer states live in pinned host memory
      and the update of that part runs on the CPU (ZeRO-Offload; "nvme" with
      "nvme_path" keeps them in a file on a local disk instead, read and
      written through libaio with DeepSpeed's "aio" settings; with
      "overlap_step": true, stages 2-3, each group's CPU update runs while
      backward goes on, bit for bit as after it); at stage 3
      offload_param {"device": "cpu"} pages the parameter shards in from
      there too ("nvme", with the optimizer on "nvme": from a file, through
      "buffer_count" pinned buffers, past the first "max_in_cpu" elements).
      The config's scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR, as
      DeepSpeed's; sharding/lr_schedule.h) sets each step's learning rate,
      which the log then shows.
      --save DIR writes training checkpoints (every rank's shard of the f32
      master weights and optimizer states, step counters and loss scaler,
      a manifest with CRC-32s written last) to DIR/step-<N>; --resume DIR
      continues from the newest complete one (the newest intact one if
      that is damaged), bit for bit as if never stopped, on any number of
      ranks and at any ZeRO stage; --steps is then the step to train up
      to. DIR is checked before the first step (writable on every rank,
      locked against a second run, and free of another run's checkpoints
      unless the run resumes from it). A rank that waits longer than
      --collective_timeout (default 600 s) for the others in a collective,
      or any error on any rank, ends every rank of the job with the error;
      resume from the last checkpoint.
      With --backend cuda each rank trains on a GPU (rank modulo the visible
      GPUs; cuBLAS and memwall's CUDA kernels) and the ranks reduce over
      NCCL; --device_memory caps the memwall allocator there (default: the
      GPU's free memory less 1 GiB for the CUDA runtime). With --backend
      meta it dry-runs the same schedule as rank 0 of --simulate_ranks
      ranks: memory and traffic are real, nothing computes.

  memwall profile [--model M] [--config FILE] [--backend meta|host|cuda]
                  [--device_memory SIZE] [--pinned_memory SIZE] [--out DIR]
                  [--batch N] [--seq N]
                  [--image N] [--steps N] [--simulate_ranks N]
                  [--collective_timeout SECONDS]
      Runs training steps under the memory profiler and writes profile.txt,
      profile.json (schema memwall.profile/1), trace.json (Perfetto) and
      profile.html to DIR/rank<k>/. M is a GPT spec or a zoo model: resnet50,
      resnest269, llama-7b, llama2-70b. The default backend is meta: any
      size, no bytes. Out of memory writes the reports of that moment.

  memwall plan [--model M] [--gpus N] [--device_memory SIZE] [--host_memory SIZE]
               [--nvme SIZE] [--config FILE] [--batch N] [--seq N] [--json]
               [--auto [--hardware H] [--out FILE [--force]]]
               [--gpus_per_node N] [--inter_node_gbit G]
               [--attention K] [--lora_rank R [--lora_targets T,...]]
      Dry-runs one whole training step of M (any spec profile takes, or
      gpt:params=80e9, gpt:layers=48,hidden=6400,heads=50; or a PyTorch
      model: hf:PATH, a Hugging Face config.json or a directory with one,
      traced on torch's meta device by the Python front end, no weights
      read: MEMWALL_PYTHON=.venv/bin/python after tools/python_env.sh; or
      traced:FILE, a description memwall.trace.describe wrote) on the meta
      backend as rank 0 of N GPUs with the config's ZeRO stage, offload and
      recomputation, and prints the peak by category, the allocator's
      reserved bytes, a 1 GiB allowance for the CUDA runtime, host and NVMe
      use, communication per step (and over links, inside and across
      nodes of --gpus_per_node), and a last line "fits: yes" or
      "fits: no" with what overflows and by how much. Sizes take GiB or GB
      (the plan prints the bytes used). Defaults: 32GiB device, 512GiB host.
      --auto (or "stage": "auto" in the config) dry-runs every combination
      of stage, optimizer offload, parameter paging, NVMe and recomputation
      (and, when the config's micro-batch x gradient_accumulation_steps is
      above 1, every micro-batch dividing that global batch, with the
      accumulation that keeps it), predicts each one's step time on a
      hardware profile, and prints the fastest that fits as a config file
      (written to --out FILE if given: an existing FILE only with --force,
      a checkpoint's file never). With --nvme, a GPT candidate with
      its parameters on NVMe that does not fit is tried with its block
      operators and its tied embedding and LM head in 2, 4, 8 or 16 tiles (the
      fewest that fit); tiles are the model's, so the plan then names the
      --model to run ("gpt2-1.5b:tiles=4,vocab_tiles=4"). Planning that
      takes more than a
      second reports on stderr, once a second, what it is doing (the
      candidate, and where in the dry-run step).

  memwall max-params [--model gpt[:seq=N,vocab=N,layers=N] | hf:PATH] [--gpus N]
                     [--device_memory SIZE] [--host_memory SIZE] [--nvme SIZE]
                     [--config FILE] [--batch N] [--seq N] [--json]
                     [--out FILE [--force]]
      The largest GPT that trains on N GPUs of SIZE with this host memory
      and NVMe per GPU (GPT-3's shape rule: hidden = 128 x heads = 128 x
      layers, seq 1024, unless the family fixes seq, vocab or layers), in
      the config's precision and optimizer at its micro-batch (default:
      bf16 AdamW, micro-batch 1). Sizes are searched by dry runs (as plan
      makes them, with the CUDA runtime's 1 GiB allowance) under the most
      memory-frugal strategy the budgets allow: stage 3 with recomputation,
      offloading to host memory and NVMe, the block weights gathered on use
      in up to 16 tiles, activation checkpoints in host memory; the largest
      size is then given the first of these, fastest first, that fits it.
      Prints the model (its --model, tiles included), the strategy, its
      device, host and NVMe use, what stops the next size up, the config
      (written to --out FILE if given) and the plan command that checks it.
      hf:PATH (a Hugging Face config.json, as plan takes it) is traced once
      and scaled in depth: its middle block repeated (its first and last
      kept), the config's width, sequence and vocabulary; the answer is
      the number of layers (its num_hidden_layers or n_layer) to set.

  memwall export --checkpoint DIR --out FILE [--dtype f32|bf16] [--force]
      Writes the master weights of the newest complete checkpoint under DIR
      (or DIR itself) as one safetensors file, a tensor per parameter by
      name, reading one parameter at a time (default dtype f32). FILE must
      not be inside a checkpoint (this or another), nor exist unless
      --force.

  memwall launch [--ranks K] -- COMMAND [ARGS...]
      Runs COMMAND as K MPI ranks on this machine (mpirun with the settings
      containers need; "memwall" as COMMAND means this binary).

  memwall demo [--backend host|meta] [--device_memory SIZE] [--params N]
               [--simulate_ranks N]
      One step of the engine on a toy model (ZeRO stage 1, bf16, AdamW),
      checked against a single-process update, with each rank's memory by
      category.

  memwall tune-aio --dir DIR [--bytes SIZE] [--buffer_count K] [--repeats R]
                   [--out FILE [--force]]
      Measures the NVMe tier on the file system of DIR (a file there, then
      removed) under DeepSpeed "aio" settings from 128 KiB to 4 MiB blocks,
      queue depths 1 to 32, one and two threads: a slot of SIZE (default
      512MiB) written, read, and updated as a training step does (chunks
      of block x depth x threads bytes through K buffers, default 4: each
      read, then written back), best of R runs (default 2). Prints MB/s
      per setting and the fastest update's settings as a config's "aio"
      block, written to FILE too if given (merge it into the training
      config; what DeepSpeed's ds_nvme_tune does for its engine); FILE is
      checked first: an existing one only with --force, a checkpoint's
      file never.

  memwall --help              this text
  memwall COMMAND --help      that command's text and its flags
  memwall --version           the version and how this binary was built

Flags may be written with dashes or underscores (--device-memory or
--device_memory).

exit status: 0 on success, 1 on an error (printed), 2 on bad usage.)";

int Fail(const absl::Status& status) {
  // What stdout holds goes first, so the error never lands inside a line
  // of a table printed before it.
  std::fflush(stdout);
  std::fprintf(stderr, "memwall: %s\n", status.ToString().c_str());
  return 1;
}

// An error on one rank of a multi-rank job ends every rank (MPI_Abort): the
// others may be waiting in a collective this rank will never join.
int FailRanks(const absl::Status& status) {
  Fail(status);
  memwall::AbortRanks(1);
  return 1;
}

// Bad usage: the problem in one line first, then the commands.
int Usage(const std::string& problem = "") {
  if (!problem.empty()) std::fprintf(stderr, "memwall: %s\n\n", problem.c_str());
  std::fprintf(stderr, "memwall: %s\n", kUsage);
  return 2;
}

// The flags each command reads. A flag given to a command that does not
// read it is refused rather than ignored (a --batch given to train would
// otherwise silently train at the config's micro-batch).
const std::map<std::string, std::set<std::string>>& FlagsOf() {
  static const auto* const flags = new std::map<std::string, std::set<std::string>>{
      {"train",
       {"backend", "device_memory", "pinned_memory", "model", "config", "steps", "data", "seed",
        "log_every", "log_format", "save", "save_every", "keep_checkpoints", "resume",
        "collective_timeout", "simulate_ranks", "out"}},
      {"profile",
       {"backend", "device_memory", "pinned_memory", "model", "config", "steps", "batch", "seq",
        "image", "simulate_ranks", "collective_timeout", "out"}},
      {"plan",
       {"device_memory", "model", "config", "batch", "seq", "image", "gpus", "host_memory", "nvme",
        "json", "auto", "hardware", "gpus_per_node", "inter_node_gbit", "out", "force",
        "attention", "lora_rank", "lora_targets"}},
      {"max-params",
       {"device_memory", "model", "config", "batch", "seq", "gpus", "host_memory", "nvme", "json",
        "out", "force"}},
      {"export", {"checkpoint", "out", "dtype", "force"}},
      {"demo", {"backend", "device_memory", "params", "simulate_ranks"}},
      {"tune-aio", {"dir", "bytes", "buffer_count", "repeats", "out", "force"}},
      {"launch", {"ranks"}},
  };
  return *flags;
}

// The names of the flags on the command line (before a "--" that starts a
// launched command's own arguments), dashes already underscores.
std::vector<std::string> GivenFlags(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    std::string name = a.substr(2, a.find('=') - 2);
    if (name.rfind("no", 0) == 0 && (name == "nojson" || name == "noauto" || name == "noforce")) {
      name = name.substr(2);
    }
    names.push_back(name);
  }
  return names;
}

// The flags on this command line (GivenFlags), set in main().
std::set<std::string>& Given() {
  static auto* const given = new std::set<std::string>();
  return *given;
}

// kInvalidArgument naming a given flag `command` does not read, or a
// flag that applies only in another mode of it.
absl::Status CheckFlagsApply(const std::string& command) {
  const std::set<std::string>& allowed = FlagsOf().at(command);
  for (const std::string& name : Given()) {
    if (allowed.count(name) > 0) continue;
    std::vector<std::string> users;
    for (const auto& [other, flags] : FlagsOf()) {
      if (flags.count(name) > 0) users.push_back(other);
    }
    if (users.empty()) continue;  // absl's own (--flagfile...)
    return absl::InvalidArgumentError(absl::StrCat("--", name, " does not apply to '", command,
                                                   "' (it is read by ",
                                                   absl::StrJoin(users, ", "), ")"));
  }
  if ((command == "train" || command == "demo") && absl::GetFlag(FLAGS_simulate_ranks) != 1 &&
      absl::GetFlag(FLAGS_backend) != "meta") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--simulate_ranks applies to '", command, "' with --backend meta only (real ranks come "
        "from the launcher: memwall launch --ranks N)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<memwall::Backend> BackendFlag(memwall::Backend fallback) {
  const std::string name = absl::GetFlag(FLAGS_backend);
  if (name.empty()) return fallback;
  return memwall::ParseBackend(name);
}


// --steps when given, else the command's own default.
int64_t StepsFlag(int64_t fallback) {
  return Given().count("steps") > 0 ? absl::GetFlag(FLAGS_steps) : fallback;
}

// --device_memory, or `fallback` (the command's own default) when not given.
absl::StatusOr<int64_t> MemoryFlag(const char* fallback = "256MiB") {
  const std::string text = absl::GetFlag(FLAGS_device_memory);
  return memwall::ParseBytes(text.empty() ? fallback : text, "--device_memory");
}

// The machine the planning commands plan for: --device_memory (32 GiB by
// default), --host_memory and --nvme per GPU.
struct Machine {
  int64_t device_bytes = 0, host_bytes = 0, nvme_bytes = 0;
};
absl::StatusOr<Machine> MachineFlags() {
  Machine m;
  MW_ASSIGN_OR_RETURN(m.device_bytes, MemoryFlag("32GiB"));
  MW_ASSIGN_OR_RETURN(m.host_bytes,
                      memwall::ParseBytes(absl::GetFlag(FLAGS_host_memory), "--host_memory"));
  MW_ASSIGN_OR_RETURN(m.nvme_bytes, memwall::ParseBytes(absl::GetFlag(FLAGS_nvme), "--nvme"));
  return m;
}

// A planning command's report on stdout, with progress on stderr after a
// second; --out (`out`, `overwrite`) is checked before the planning, which
// can take minutes.
int PrintReport(const std::string& out, bool overwrite, const char* command,
                const std::function<absl::StatusOr<std::string>(memwall::PlanProgress*)>& report) {
  if (!out.empty()) {
    if (auto s = memwall::CheckOutputFile("--out", out, overwrite); !s.ok()) return Fail(s);
  }
  memwall::PlanProgress progress(stderr, command);
  const absl::StatusOr<std::string> text = report(&progress);
  if (!text.ok()) return Fail(text.status());
  std::fputs(text->c_str(), stdout);
  return 0;
}

int Plan() {
  const absl::StatusOr<Machine> machine = MachineFlags();
  if (!machine.ok()) return Fail(machine.status());
  memwall::PlanOptions options;
  options.device_bytes = machine->device_bytes;
  options.host_bytes = machine->host_bytes;
  options.nvme_bytes = machine->nvme_bytes;
  options.model = absl::GetFlag(FLAGS_model);
  options.config_path = absl::GetFlag(FLAGS_config);
  options.gpus = absl::GetFlag(FLAGS_gpus);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.seq = absl::GetFlag(FLAGS_seq);
  options.image = absl::GetFlag(FLAGS_image);
  options.json = absl::GetFlag(FLAGS_json);
  options.auto_strategy = absl::GetFlag(FLAGS_auto);
  options.hardware = absl::GetFlag(FLAGS_hardware);
  options.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  options.inter_node_gbit = absl::GetFlag(FLAGS_inter_node_gbit);
  // This machine's "device" is the host backend's: no CUDA runtime to allow for.
  if (options.hardware == "this-machine") options.runtime_allowance = 0;
  options.out_path = absl::GetFlag(FLAGS_out);
  options.overwrite_out = absl::GetFlag(FLAGS_force);
  options.attention = absl::GetFlag(FLAGS_attention);
  options.lora_rank = absl::GetFlag(FLAGS_lora_rank);
  options.lora_targets = absl::GetFlag(FLAGS_lora_targets);
  return PrintReport(options.out_path, options.overwrite_out, "memwall plan",
                     [&](memwall::PlanProgress* progress) {
                       options.progress = progress;
                       return memwall::PlanReport(options);
                     });
}

// `memwall max-params`: the family's largest member that trains.
int MaxParams() {
  const absl::StatusOr<Machine> machine = MachineFlags();
  if (!machine.ok()) return Fail(machine.status());
  memwall::MaxParamsRequest flags;
  flags.device_bytes = machine->device_bytes;
  flags.host_bytes = machine->host_bytes;
  flags.nvme_bytes = machine->nvme_bytes;
  flags.family = Given().count("model") > 0 ? absl::GetFlag(FLAGS_model) : "gpt";
  flags.config_path = absl::GetFlag(FLAGS_config);
  flags.gpus = absl::GetFlag(FLAGS_gpus);
  flags.batch = absl::GetFlag(FLAGS_batch);
  flags.seq = absl::GetFlag(FLAGS_seq);
  flags.json = absl::GetFlag(FLAGS_json);
  flags.out_path = absl::GetFlag(FLAGS_out);
  flags.overwrite_out = absl::GetFlag(FLAGS_force);
  const std::string device_text = absl::GetFlag(FLAGS_device_memory);
  flags.machine_flags = absl::StrCat(
      "--gpus ", flags.gpus, " --device_memory ", device_text.empty() ? "32GiB" : device_text,
      " --host_memory ", absl::GetFlag(FLAGS_host_memory), " --nvme ", absl::GetFlag(FLAGS_nvme),
      flags.batch > 0 ? absl::StrCat(" --batch ", flags.batch) : "");
  return PrintReport(flags.out_path, flags.overwrite_out, "memwall max-params",
                     [&](memwall::PlanProgress* progress) {
                       return memwall::MaxParamsReport(flags, progress);
                     });
}

int Demo() {
  memwall::SelfCheckOptions options;
  auto backend = BackendFlag(memwall::Backend::kHost);
  if (!backend.ok()) return Fail(backend.status());
  options.backend = *backend;
  auto capacity = MemoryFlag();
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
  options.simulate_ranks = absl::GetFlag(FLAGS_simulate_ranks);
  const absl::Status status = memwall::RunDemo(options);
  return status.ok() ? 0 : FailRanks(status);
}

// `memwall tune-aio`: the sweep, a line per setting, the fastest update's
// settings as an "aio" block.
int TuneAio() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    return Usage("tune-aio: expected --dir DIR (a directory on the disk to measure)");
  }
  const absl::StatusOr<int64_t> bytes = memwall::ParseBytes(absl::GetFlag(FLAGS_bytes), "--bytes");
  if (!bytes.ok()) return Fail(bytes.status());
  const int buffers = absl::GetFlag(FLAGS_buffer_count);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const std::pair<const char*, int> counts[] = {{"--buffer_count", buffers},
                                                {"--repeats", repeats}};
  for (const auto& [flag, value] : counts) {
    if (value < 1) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat(flag, ": expected at least 1, got ", value)));
    }
  }
  // --out is checked before the sweep (minutes), and written at its end.
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (auto s = memwall::CheckOutputFile("--out", out, absl::GetFlag(FLAGS_force)); !s.ok()) {
      return Fail(s);
    }
  }
  const std::vector<memwall::AioConfig> sweep = memwall::AioSweep(*bytes, buffers);
  if (sweep.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--bytes: expected a multiple of 128 KiB (the smallest setting's chunk), at "
                     "least ",
                     buffers, " of them, got ", *bytes)));
  }
  std::printf("memwall tune-aio: %s, a slot of %s through %d buffers, best of %d\n", dir.c_str(),
              memwall::FormatBytes(*bytes).c_str(), buffers, repeats);
  std::printf("%10s %6s %8s %10s %10s %10s %12s\n", "block", "depth", "threads", "chunk",
              "write MB/s", "read MB/s", "update MB/s");
  const memwall::AioConfig* best = nullptr;
  double best_mbps = 0;
  for (const memwall::AioConfig& aio : sweep) {
    const absl::StatusOr<memwall::AioThroughput> t =
        memwall::MeasureAio(dir, aio, buffers, *bytes, repeats);
    if (!t.ok()) return Fail(t.status());
    std::printf("%10s %6d %8d %10s %10.0f %10.0f %12.0f%s\n",
                memwall::FormatBytes(aio.block_size).c_str(), aio.queue_depth, aio.thread_count,
                memwall::FormatBytes(memwall::AioChunkBytes(aio)).c_str(), t->write_mbps,
                t->read_mbps, t->update_mbps, t->direct ? "" : "  (buffered: no O_DIRECT)");
    std::fflush(stdout);
    if (t->update_mbps > best_mbps) {
      best_mbps = t->update_mbps;
      best = &aio;
    }
  }
  const nlohmann::ordered_json block = {{"aio",
                                         {{"block_size", best->block_size},
                                          {"queue_depth", best->queue_depth},
                                          {"thread_count", best->thread_count},
                                          {"single_submit", best->single_submit},
                                          {"overlap_events", best->overlap_events}}}};
  std::printf("fastest update: %.0f MB/s with\n%s\n", best_mbps, block.dump(2).c_str());
  if (out.empty()) return 0;
  if (auto s = memwall::WriteOutputFile("--out", out, block.dump(2) + "\n",
                                        absl::GetFlag(FLAGS_force));
      !s.ok()) {
    return Fail(s);
  }
  std::printf("written to %s\n", out.c_str());
  return 0;
}

// The flags `train` and `profile` share, into either's options.
template <typename Options>
absl::Status ReadModelFlags(memwall::Backend fallback, Options& options) {
  auto backend = BackendFlag(fallback);
  if (!backend.ok()) return backend.status();
  options.backend = *backend;
  // cuda: 0 until the rank knows its GPU (DeviceBytesFor).
  auto capacity = MemoryFlag(*backend == memwall::Backend::kCuda ? "0" : "256MiB");
  if (!capacity.ok()) return capacity.status();
  options.capacity_bytes = *capacity;
  auto pinned = memwall::ParseBytes(absl::GetFlag(FLAGS_pinned_memory), "--pinned_memory");
  if (!pinned.ok()) return pinned.status();
  options.pinned_bytes = *pinned;
  options.model = absl::GetFlag(FLAGS_model);
  options.config_path = absl::GetFlag(FLAGS_config);
  options.simulate_ranks = absl::GetFlag(FLAGS_simulate_ranks);
  const double timeout = absl::GetFlag(FLAGS_collective_timeout);
  if (!(timeout >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collective_timeout: expected seconds >= 0 (0: wait forever), got ", timeout));
  }
  options.collective_timeout =
      timeout == 0 ? absl::InfiniteDuration() : absl::Seconds(timeout);
  return absl::OkStatus();
}

int Profile() {
  memwall::ProfileOptions options;
  if (auto s = ReadModelFlags(memwall::Backend::kMeta, options); !s.ok()) return Fail(s);
  if (!absl::GetFlag(FLAGS_out).empty()) options.out_dir = absl::GetFlag(FLAGS_out);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.seq = absl::GetFlag(FLAGS_seq);
  options.image = absl::GetFlag(FLAGS_image);
  options.steps = StepsFlag(1);
  const absl::StatusOr<memwall::ProfileSummary> summary = memwall::RunProfile(options);
  if (!summary.ok()) return FailRanks(summary.status());
  if (summary->rank != 0) return 0;
  if (!summary->recomputation.empty()) {
    std::printf("activation recomputation: %s\n", summary->recomputation.c_str());
  }
  std::printf("%s", summary->report.c_str());
  std::printf("per-rank peaks over %d rank%s (max / min / imbalance = (max - min) / max):\n",
              summary->world_size, summary->world_size == 1 ? "" : "s");
  for (int i = 0; i < memwall::ProfileSummary::kFields; ++i) {
    const int64_t max = summary->peak_max[i], min = summary->peak_min[i];
    if (max == 0 && i > 0) continue;
    const std::string name = i == 0 ? "total"
                                    : std::string(memwall::MemoryCategoryName(
                                          memwall::kAllMemoryCategories[i - 1]));
    std::printf("  %-24s %12s / %12s / %5.1f%%\n", name.c_str(),
                memwall::FormatBytes(max).c_str(), memwall::FormatBytes(min).c_str(),
                max ? 100.0 * (max - min) / max : 0.0);
  }
  std::printf("reports: %s/rank*/\n", options.out_dir.c_str());
  return 0;
}

int Train() {
  memwall::TrainOptions options;
  if (auto s = ReadModelFlags(memwall::Backend::kHost, options); !s.ok()) return Fail(s);
  options.steps = StepsFlag(100);
  options.data_path = absl::GetFlag(FLAGS_data);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.log_every = absl::GetFlag(FLAGS_log_every);
  options.save_dir = absl::GetFlag(FLAGS_save);
  options.save_every = absl::GetFlag(FLAGS_save_every);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.resume_dir = absl::GetFlag(FLAGS_resume);
  if (!absl::GetFlag(FLAGS_out).empty()) options.oom_dir = absl::GetFlag(FLAGS_out);
  const absl::Status status = memwall::RunTrainCommand(options, absl::GetFlag(FLAGS_log_format));
  return status.ok() ? 0 : FailRanks(status);
}

int Export() {
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "f32" && dtype != "bf16") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--dtype: expected f32 or bf16, got '", dtype, "'")));
  }
  if (absl::GetFlag(FLAGS_checkpoint).empty() || absl::GetFlag(FLAGS_out).empty()) {
    return Fail(absl::InvalidArgumentError("export: --checkpoint DIR and --out FILE are required"));
  }
  const absl::StatusOr<std::string> exported =
      memwall::ExportCheckpoint(absl::GetFlag(FLAGS_checkpoint), absl::GetFlag(FLAGS_out),
                                dtype == "f32" ? memwall::DType::kF32 : memwall::DType::kBF16,
                                absl::GetFlag(FLAGS_force));
  if (!exported.ok()) return Fail(exported.status());
  std::printf("exported %s to %s (%s)\n", exported->c_str(), absl::GetFlag(FLAGS_out).c_str(),
              dtype.c_str());
  return 0;
}

// Replaces this process with mpirun starting `command` on K ranks.
int Launch(const std::vector<char*>& command) {
  // Every rank starts on this machine: beyond a few per core they only
  // share the cores, and at tens of thousands mpirun fails without a word.
  constexpr int kMaxRanks = 1024;
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 1 || ranks > kMaxRanks) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--ranks: expected 1 to ", kMaxRanks, " (every rank starts on this machine, which has ",
        std::thread::hardware_concurrency(), " cores; a dry run of more GPUs is memwall plan "
        "--gpus N or train --backend meta --simulate_ranks N), got ", ranks)));
  }
  if (command.empty()) return Usage("launch: no command after --ranks (memwall launch --ranks K -- COMMAND)");
  // Shared memory without single-copy (containers often lack the ptrace
  // rights CMA needs), oversubscription allowed, one BLAS thread per rank.
  setenv("OMPI_MCA_btl", "self,vader", /*overwrite=*/0);
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "-np", std::to_string(ranks)};
  if (geteuid() == 0) args.insert(args.begin() + 1, "--allow-run-as-root");
  for (size_t i = 0; i < command.size(); ++i) {
    std::string word = command[i];
    if (i == 0 && word == "memwall") {
      char self[PATH_MAX];
      const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
      if (n > 0) word.assign(self, n);
    }
    args.push_back(word);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp("mpirun", argv.data());
  return Fail(absl::UnavailableError(
      "launch: cannot run mpirun (install openmpi-bin, or start the ranks yourself)"));
}

}  // namespace

// Flags are spelled with underscores (absl's convention) and, as in the
// DeepSpeed and PyTorch tools users know, with dashes: "--device-memory"
// is read as "--device_memory". Only flag names change, never values, and
// nothing after "--" (a launched command's own arguments).
std::vector<std::string> DashesToUnderscores(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = 2; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return args;
}

namespace {

// The flags absl reads itself, let through to it (--help and --version
// memwall answers before absl sees them).
bool AbslFlag(const std::string& name) {
  static const std::set<std::string> kAbsl = {"flagfile", "fromenv", "tryfromenv", "undefok"};
  return kAbsl.count(name) > 0;
}

// The edit distance between two flag names (for "did you mean").
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// kInvalidArgument for a flag no command reads (with the nearest that one
// does, if any is close) or a flag given twice: absl would end the first
// with exit 1 and its own text, and silently keep the last of the second.
absl::Status CheckFlagNames(const std::vector<std::string>& given) {
  std::set<std::string> known, seen;
  for (const auto& [command, flags] : FlagsOf()) known.insert(flags.begin(), flags.end());
  for (const std::string& name : given) {
    if (AbslFlag(name)) continue;
    if (known.count(name) == 0) {
      std::string nearest;
      size_t best = 3;  // at most two edits away
      for (const std::string& k : known) {
        const size_t d = Distance(name, k);
        if (d < best) best = d, nearest = k;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, nearest.empty() ? "" : absl::StrCat(" (did you mean --", nearest, "?)")));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " given twice; give it once"));
    }
  }
  return absl::OkStatus();
}

// The section of the usage text for `command` ("  memwall train ..." up to
// the blank line after it).
std::string CommandUsage(const std::string& command) {
  const std::string usage = kUsage;
  const size_t begin = usage.find(absl::StrCat("\n  memwall ", command, " "));
  if (begin == std::string::npos) return usage;
  const size_t end = usage.find("\n\n", begin + 1);
  return usage.substr(begin + 1, end == std::string::npos ? std::string::npos : end - begin - 1);
}

// `memwall [COMMAND] --help`: on stdout, exit 0. A command's help has its
// section of the usage and the flags it reads, with their defaults.
int Help(const std::string& command) {
  if (FlagsOf().count(command) == 0) {
    std::printf("memwall: %s\n", kUsage);
    return 0;
  }
  std::printf("%s\n\nflags of '%s':\n", CommandUsage(command).c_str(), command.c_str());
  for (const std::string& name : FlagsOf().at(command)) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::printf("  --%s (default: %s)\n      %s\n", name.c_str(),
                flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue().c_str(),
                flag->Help().c_str());
  }
  return 0;
}

int Version() {
#ifdef MEMWALL_HAS_CUDA
  const char* cuda = "with the cuda backend (CUDA toolkit, NCCL, cuBLAS)";
#else
  const char* cuda = "without the cuda backend (--config=nocuda)";
#endif
#ifdef NDEBUG
  const char* mode = "optimized";
#else
  const char* mode = "debug";
#endif
  std::printf("memwall %s, %s build %s\n", memwall::kVersion, mode, cuda);
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args = DashesToUnderscores(argc, argv);
  // --help and --version are answered here (absl's exit 1, and print a
  // build mode rather than a version); then flag names are checked
  // before absl parses them.
  const std::vector<std::string> given = GivenFlags(args);
  std::string first;  // the command, if one is named
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i].rfind("-", 0) != 0) {
      first = args[i];
      break;
    }
  }
  for (const std::string& name : given) {
    if (name == "help" || name == "helpfull" || name == "helpshort") return Help(first);
    if (name == "version") return Version();
  }
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "-h") return Help(first);
  }
  if (absl::Status names = CheckFlagNames(given); !names.ok()) {
    return Usage(std::string(names.message()));
  }
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  if (positional.size() < 2) return Usage("no command given");
  const std::string command = positional[1];
  for (const std::string& name : given) Given().insert(name);
  if (FlagsOf().count(command) == 0) {
    return Usage(absl::StrCat("unknown command '", command,
                              "' (expected train, profile, plan, max-params, export, launch, "
                              "demo or tune-aio)"));
  }
  if (absl::Status applies = CheckFlagsApply(command); !applies.ok()) {
    return Usage(std::string(applies.message()));
  }
  if (command == "launch") {
    return Launch(std::vector<char*>(positional.begin() + 2, positional.end()));
  }
  if (positional.size() != 2) {
    return Usage(absl::StrCat("unexpected argument '", positional[2], "' after '", command,
                              "' (flags start with --)"));
  }
  if (command == "train") return Train();
  if (command == "demo") return Demo();
  if (command == "tune-aio") return TuneAio();
  if (command == "profile") return Profile();
  if (command == "plan") return Plan();
  if (command == "max-params") return MaxParams();
  return Export();
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: OpenBLAS has read its settings already, and a
  // better kernel set needs this process started again (Note in
  // kernels/cpu/blas_core.h).
  memwall::kernels::cpu::ChooseBlasCore(argv);
  absl::SetProgramUsageMessage(kUsage);
  // What memwall allocates on the host is sized from the input before it is
  // touched; should the host still run out (another process took the
  // memory), the user gets a message, and the other ranks end, rather
  // than an abort with "terminate called".
  try {
    return Main(argc, argv);
  } catch (const std::bad_alloc&) {
    return FailRanks(absl::ResourceExhaustedError(absl::StrCat(
        "out of host memory (std::bad_alloc) in 'memwall", argc > 1 ? " " : "",
        argc > 1 ? argv[1] : "", "'")));
  }
}
