"""Worker: a small GPT-2 under a ZeroOptimizer at stage 3 on this rank,
three steps with activation_checkpointing "full" and three with "none"
from the same start; writes each run's losses and the segments recomputed
to OUT.rank<r> (tests/python/test_recompute.py). With "auto": a small
Llama at sequence 256 under stage "auto" on a 4 MiB device, one step;
writes the choice, the stage, the segments recomputed and the loss."""
import json
import sys

import torch
import transformers

import memwall
import memwall.torch as mt


def run(planner):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=256,
                                     n_positions=64, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    opt = mt.ZeroOptimizer(model, config={
        "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "activation_checkpointing": {"planner": planner}})
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + memwall.rank())
        ids = torch.randint(0, 256, (2, 32), generator=g)
        torch.manual_seed(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    chosen = opt.recomputation
    return losses, len(chosen["segments"]) if chosen else 0


def auto():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=256, use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    model.train()
    g = torch.Generator().manual_seed(memwall.rank())
    ids = torch.randint(0, 256, (1, 256), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    opt = mt.ZeroOptimizer(model, config={
        "zero_optimization": {"stage": "auto"}, "train_micro_batch_size_per_gpu": 1},
        device_memory="4MiB", example_inputs=batch)
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    return {"chosen": opt.auto_choice["chosen"], "stage": opt.engine.stage,
            "segments": len(opt.recomputation["segments"]), "loss": loss.item(),
            "steps": opt.engine.progress()["steps_applied"]}


def main():
    out = sys.argv[1]
    if sys.argv[2:] == ["auto"]:
        result = auto()
    else:
        with_losses, segments = run("full")
        without, _ = run("none")
        result = {"with": with_losses, "without": without, "segments": segments}
    with open("%s.rank%d" % (out, memwall.rank()), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
