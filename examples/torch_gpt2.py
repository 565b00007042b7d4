# A transformers GPT-2 trained with memwall's ZeRO stage 3 (README "PyTorch").
#   memwall launch --ranks 2 -- .venv/bin/python examples/torch_gpt2.py [STEPS [SAVE_DIR]]
import sys
import torch, transformers
import memwall.torch

torch.manual_seed(0)  # every rank builds the same model
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0))
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
config = {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}}
opt = memwall.torch.ZeroOptimizer(model, [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], config)
warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 10))
text = torch.tensor(list(b"memwall shards what torch trains. " * 40))
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
    start = (step * 97 + opt.engine.rank * 31) % (len(text) - 90)  # this rank's batch
    batch = torch.stack([text[start + i:start + i + 64] for i in range(0, 32, 8)])
    opt.zero_grad()
    loss = model(batch, labels=batch).loss
    loss.backward()          # torch's own loop: only the optimizer line changed
    opt.step()
    warmup.step()
    if opt.engine.rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.3f}")
with opt.gathered_parameters():  # stage 3: every rank gathers, rank 0 saves the real weights
    if opt.engine.rank == 0 and len(sys.argv) > 2:
        model.save_pretrained(sys.argv[2])
