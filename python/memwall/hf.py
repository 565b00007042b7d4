"""memwall.hf: Hugging Face models from their config alone, on torch's meta
device (no weights read, no memory), and their descriptions for memwall's
planner; LoRA adapters for fine-tuning plans.

    model = memwall.hf.build("path/to/config.json", dtype="bf16")
    memwall.hf.lora(model, rank=16, targets=("q_proj", "v_proj"))
    d = memwall.hf.describe("path/to/dir", seq=4096, dtype="bf16")

Run as a program it writes a description (models/traced.h) for
`memwall plan --model hf:PATH`, which calls it:

    python -m memwall.hf PATH --seq 4096 --dtype bf16 --out model.json
        [--attention auto|flash|efficient|math] [--lora-rank R
        --lora-targets q_proj,v_proj] [--batch B]
"""
import argparse
import json
import os
import sys

import torch

import memwall.trace as tracing

__all__ = ["LoraLinear", "build", "describe", "inputs_for", "learned_positions", "lora"]

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _config(source):
    import transformers
    if isinstance(source, transformers.PretrainedConfig):
        return source
    if isinstance(source, dict):
        values = dict(source)
        if "model_type" not in values:
            raise ValueError("config: expected a \"model_type\" key (as config.json has)")
        return transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    path = os.fspath(source)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError("%s: no such config.json (expected a config file or a "
                                "directory holding config.json)" % path)
    with open(path) as f:
        try:
            values = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError("%s: not JSON (%s)" % (path, e)) from None
    if not isinstance(values, dict) or "model_type" not in values:
        raise ValueError("%s: expected a Hugging Face config with a \"model_type\"" % path)
    return _config(values)


# Deeper configs are refused before tracing (layers): the deepest published
# transformers have a few hundred layers, and a trace holds every layer's
# modules in Python (100,000 layers took minutes and gigabytes).
MAX_LAYERS = 4096


def _depth(config):
    """The layer count a config names, or None."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return key, value
    return None


def build(source, dtype="f32"):
    """The model a Hugging Face config describes (a config.json path, a
    directory with one, a dict or a PretrainedConfig), built on meta in
    `dtype`: the class its "architectures" names, else the causal-LM auto
    class. A config transformers cannot build a model from (hidden_size 0,
    say) raises ValueError naming the config and transformers' error."""
    import transformers
    config = _config(source)
    depth = _depth(config)
    if depth is not None and depth[1] > MAX_LAYERS:
        raise ValueError("%s: %s %d; expected at most %d layers (the deepest published models "
                         "have a few hundred)" % (_name(source), depth[0], depth[1], MAX_LAYERS))
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    try:
        with torch.device("meta"):
            if cls is not None:
                model = cls(config)
            else:
                model = transformers.AutoModelForCausalLM.from_config(config)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError("%s: transformers cannot build %s from this config (%s: %s)"
                         % (_name(source), cls.__name__ if cls else "a causal LM",
                            type(e).__name__, e)) from e
    if dtype not in _DTYPES:
        raise ValueError("dtype: expected f32, bf16 or f16, got %r" % (dtype,))
    return model.to(_DTYPES[dtype])


def _name(source):
    """How errors name a config given as a path, a dict or an object."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return "config"


def learned_positions(model):
    """How many positions `model`'s learned position embedding holds (GPT-2's
    wpe, BERT's position_embeddings, OPT's embed_positions less its offset):
    the longest sequence it can run. None for a model without one (rotary
    embeddings have no table and run at any length)."""
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if isinstance(module, torch.nn.Embedding) and ("pos" in leaf or leaf == "wpe"):
            return module.num_embeddings - getattr(module, "offset", 0)
    return None


def inputs_for(model, seq=None, image=None):
    """make_inputs(batch) for a training step of `model`: token ids with
    labels for language models (sequence `seq`, default the config's
    maximum positions), pixels with class labels for image classifiers."""
    config = model.config
    device = next(model.parameters()).device
    if hasattr(config, "image_size") and hasattr(config, "num_channels"):
        size = image or config.image_size
        labels = getattr(config, "num_labels", 0)

        def make(batch):
            pixels = torch.zeros(batch, config.num_channels, size, size, device=device,
                                 dtype=next(model.parameters()).dtype)
            out = {"pixel_values": pixels}
            if "ForImageClassification" in type(model).__name__ and labels:
                out["labels"] = torch.zeros(batch, dtype=torch.long, device=device)
            return out
        return make
    length = seq or getattr(config, "max_position_embeddings", None) or \
        getattr(config, "n_positions", None)
    if not length:
        raise ValueError("seq: the config gives no maximum length; pass one")
    limit = learned_positions(model)
    if limit is not None and length > limit:
        # On meta an embedding index past the table raises nothing: the plan
        # would describe a model that fails at its first real step.
        raise ValueError("seq %d: %s learns %d positions (its position embedding's rows); "
                         "expected a sequence of at most %d"
                         % (length, type(model).__name__, limit, limit))
    with_labels = any(s in type(model).__name__ for s in ("ForCausalLM", "LMHeadModel",
                                                           "ForMaskedLM"))

    def make(batch):
        ids = torch.zeros(batch, length, dtype=torch.long, device=device)
        out = {"input_ids": ids}
        if with_labels:
            out["labels"] = ids
        # use_cache stays the config's, as a training loop leaves it (a
        # caller's inputs with use_cache=False trace too: memwall.trace
        # answers transformers' packed-sequence check on meta).
        return out
    return make


def _linear_features(module):
    """(in, out) of a linear layer: torch's nn.Linear, or transformers'
    Conv1D (GPT-2's c_attn, c_proj, c_fc: weight [in, out]); None for any
    other module."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.shape[0], module.nf
    return None


class LoraLinear(torch.nn.Module):
    """A frozen linear layer (nn.Linear or transformers' Conv1D) plus a
    trainable low-rank update (Hu et al. 2021): y = base(x) + (alpha /
    rank) * B(A(x)), A [rank, in] and B [out, rank] (B starts at zero, so
    training starts from the base)."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base_layer = base
        features_in, features_out = _linear_features(base)
        self.lora_A = torch.nn.Linear(features_in, rank, bias=False,
                                      device=base.weight.device, dtype=base.weight.dtype)
        self.lora_B = torch.nn.Linear(rank, features_out, bias=False,
                                      device=base.weight.device, dtype=base.weight.dtype)
        if base.weight.device.type != "meta":
            torch.nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def lora(model, rank=8, targets=("q_proj", "v_proj"), alpha=None):
    """Freezes `model` and wraps each linear layer (nn.Linear, or
    transformers' Conv1D as GPT-2 has) whose attribute name is in `targets`
    in a LoraLinear of `rank` (alpha: default 2 x rank), as peft does.
    Returns the model; raises ValueError if no target matches."""
    if rank < 1:
        raise ValueError("lora rank: expected >= 1, got %d" % rank)
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and _linear_features(child) is not None:
                setattr(module, name, LoraLinear(child, rank, alpha or 2 * rank))
                wrapped += 1
    if not wrapped:
        raise ValueError("lora targets %s: no linear layer of the model has those names"
                         % ", ".join(targets))
    return model


def describe(source, seq=None, dtype="f32", attention="auto", lora_rank=0,
             lora_targets=("q_proj", "v_proj"), image=None, batch=1):
    """The planner's description (memwall.trace.describe) of the model a
    Hugging Face config describes, traced on meta at micro-batches `batch`
    and batch + 1; with lora_rank > 0, of its LoRA fine-tuning."""
    model = build(source, dtype)
    if lora_rank:
        lora(model, lora_rank, tuple(lora_targets))
    model.train()
    return tracing.describe(model, inputs_for(model, seq, image), attention=attention,
                            batches=(batch, batch + 1))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m memwall.hf",
        description="Write memwall's description of a Hugging Face model's training step "
                    "(traced on torch's meta device from its config alone).")
    parser.add_argument("config", help="a config.json, or a directory holding one")
    parser.add_argument("--seq", type=int, default=0, help="sequence length (0: the config's)")
    parser.add_argument("--image", type=int, default=0, help="image size (0: the config's)")
    parser.add_argument("--dtype", default="f32", choices=sorted(_DTYPES))
    parser.add_argument("--attention", default="auto", choices=tracing.ATTENTION_KERNELS)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--lora-targets", default="q_proj,v_proj")
    parser.add_argument("--batch", type=int, default=1,
                        help="the micro-batch planned (traced at it and one more)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        d = describe(args.config, args.seq or None, args.dtype, args.attention, args.lora_rank,
                     tuple(t for t in args.lora_targets.split(",") if t), args.image or None,
                     max(args.batch, 1))
    except (OSError, ValueError) as e:
        print("memwall.hf: %s" % e, file=sys.stderr)
        return 2
    with open(args.out, "w") as f:
        json.dump(d, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
