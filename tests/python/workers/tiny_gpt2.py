"""The small transformers GPT-2 the workers train (every rank builds the
same one): byte-sized vocabulary, 2 layers, dropout off."""
import torch
import transformers


def tiny_gpt2():
    """(config, model), the model drawn from seed 0."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    return config, transformers.GPT2LMHeadModel(config)
