#!/usr/bin/python3
"""PyTorch's side of `bench/train_vs_pytorch.sh`: the same GPT-2 as anvil's config (learned
positions, pre-LayerNorm, tanh GELU, tied embeddings, causal attention), AdamW in fp32, timed
over the same steps on random tokens. Prints one JSON line like `anvil bench train`.

usage: pytorch_gpt2.py --layers 4 --heads 4 --d-model 256 --vocab 50257 --seq 256 --batch 8
                       [--steps 10] [--warmup 2] [--threads 2]
                       [--device cpu|cuda] [--precision fp32|amp_bf16] [--attention manual|sdpa]
On a GPU: --precision amp_bf16 runs under torch.autocast (bf16), --attention sdpa uses
F.scaled_dot_product_attention (flash attention in PyTorch 2) instead of the explicit softmax.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fcproj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=-1))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            y = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, d, vocab, seq, sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, sdpa) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        self.register_buffer("mask", ~torch.tril(torch.ones(seq, seq, dtype=torch.bool)))
        for name, p in self.named_parameters():  # GPT-2's init, as anvil's
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fcproj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("heads", 4), ("d-model", 256), ("vocab", 50257), ("seq", 256),
                          ("batch", 8), ("steps", 10), ("warmup", 2), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "amp_bf16"])
    p.add_argument("--attention", default="manual", choices=["manual", "sdpa"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(17)
    dev = torch.device(a.device)
    model = GPT(a.layers, a.heads, a.d_model, a.vocab, a.seq, a.attention == "sdpa").to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    stream = torch.randint(0, a.vocab, (a.batch * a.seq + 1,))
    x, y = stream[:-1].view(a.batch, a.seq).to(dev), stream[1:].view(a.batch, a.seq).to(dev)
    cuda = dev.type == "cuda"

    def step():
        opt.zero_grad(set_to_none=True)
        if a.precision == "amp_bf16":
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss = float(loss)  # waits for the device
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"tokens_per_s": a.batch * a.seq * a.steps / secs, "peak_rss_mib": rss, "loss": loss,
           "torch": torch.__version__, "threads": torch.get_num_threads(), "device": a.device,
           "precision": a.precision, "attention": a.attention}
    if cuda:
        row["gpu_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(row))


if __name__ == "__main__":
    main()
