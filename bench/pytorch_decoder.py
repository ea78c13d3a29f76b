#!/usr/bin/python3
"""PyTorch's side of `bench/train_vs_pytorch.sh`: the model of an `anvil bench train` run, built in
plain PyTorch from the architecture that run reports (its JSON line's "model"), trained with
AdamW in fp32 and global-norm clipping on random tokens, timed over the same steps. Prints one
JSON line like `anvil bench train`.

usage: pytorch_decoder.py --anvil-json 'LAST LINE OF anvil bench train' [--steps 10] [--warmup 2]
                          [--threads 2] [--attention manual|sdpa] [--compile]

The families follow their published definitions, as the golden fixtures under tests/golden do:
GPT-2 (learned positions, LayerNorm, tanh GELU, biases, tied head); MPT (LLM Foundry: ALiBi
added to the scaled scores with gen_slopes' slopes, LayerNorm without bias, exact GELU, no
biases); Llama (Hugging Face: RMSNorm, RoPE in the rotate-half convention, grouped key/value
heads repeated per query head as repeat_kv does, SwiGLU, its own LM head). Every option anvil
reports is honoured (dropout at the same sites included), so a mixed architecture (an MPT with RoPE and GQA) is built as anvil built it.
With kernels=gpu in the run the model runs on cuda; precision amp_bf16 runs under torch.autocast
(bf16); --attention sdpa uses F.scaled_dot_product_attention (PyTorch 2) instead of the explicit
softmax.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):  # in fp32, as Hugging Face's LlamaRMSNorm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(m, width=None):
    width = width or m["d_model"]
    if m["norm"] == "rmsnorm":
        return RMSNorm(width, m["norm_eps"])
    norm = nn.LayerNorm(width, elementwise_affine=True)
    if not m["norm_bias"]:
        norm.bias = None  # LLM Foundry's low-precision LayerNorm without bias: F.layer_norm(x, w, None)
    return norm


def alibi_slopes(n_heads, bias_max):  # LLM Foundry's gen_slopes
    n = 2 ** math.ceil(math.log2(n_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n + 1, dtype=torch.float32) * (bias_max / n))
    if n != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def drop(x, p):  # nothing at all without dropout, so the baseline pays no mask
    return F.dropout(x, p) if p > 0 else x


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, m, sdpa):
        super().__init__()
        d, bias = m["d_model"], m["linear_bias"]
        self.nh, self.nkv, self.sdpa = m["n_heads"], m["n_kv_heads"], sdpa
        self.hs = m.get("head_dim", d // self.nh)
        self.attn_p, self.resid_p = m.get("attn_pdrop", 0.0), m.get("resid_pdrop", 0.0)
        self.norm1, self.norm2 = make_norm(m), make_norm(m)
        # LLM Foundry's qk_ln ("whole"): the block's norm over all the queries and over all the keys;
        # Qwen3's q_norm and k_norm ("per_head"): one over each head's channels.
        self.qk_norm = m.get("qk_norm", "none")
        if self.qk_norm == "whole":
            self.q_ln, self.k_ln = make_norm(m, self.nh * self.hs), make_norm(m, self.nkv * self.hs)
        elif self.qk_norm == "per_head":
            self.q_ln, self.k_ln = make_norm(m, self.hs), make_norm(m, self.hs)
        self.qkv = nn.Linear(d, (self.nh + 2 * self.nkv) * self.hs, bias=bias or m.get("qkv_bias", False))
        self.proj = nn.Linear(self.nh * self.hs, d, bias=bias)
        self.swiglu, hidden = m["mlp"] == "swiglu", m["mlp_hidden"]
        self.gelu = "tanh" if m["mlp"] == "gelu_tanh" else "none"
        self.up = nn.Linear(d, 2 * hidden if self.swiglu else hidden, bias=bias)  # SwiGLU: gate | up
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x, pos):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.nh * self.hs, self.nkv * self.hs, self.nkv * self.hs], -1)
        if self.qk_norm == "whole":
            q, k = self.q_ln(q), self.k_ln(k)
        q = q.view(B, T, self.nh, self.hs)
        k = k.view(B, T, self.nkv, self.hs)
        if self.qk_norm == "per_head":
            q, k = self.q_ln(q), self.k_ln(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, self.nkv, self.hs).transpose(1, 2)
        if pos.get("cos") is not None:
            cos, sin = pos["cos"][:T].to(q.dtype), pos["sin"][:T].to(q.dtype)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:  # repeat_kv
            g = self.nh // self.nkv
            k = k[:, :, None].expand(B, self.nkv, g, T, self.hs).reshape(B, self.nh, T, self.hs)
            v = v[:, :, None].expand(B, self.nkv, g, T, self.hs).reshape(B, self.nh, T, self.hs)
        bias = pos["mask"][:, :T, :T]  # 0 or -inf, plus ALiBi's slope * (j - i) where the model has it
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=self.attn_p)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs) + bias
            y = drop(att.softmax(dim=-1), self.attn_p) @ v
        x = x + drop(self.proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hs)), self.resid_p)
        h = self.up(self.norm2(x))
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate=self.gelu)
        return x + drop(self.down(h), self.resid_p)


class Decoder(nn.Module):
    def __init__(self, m, seq, sdpa):
        super().__init__()
        d, V = m["d_model"], m["vocab_size"]
        self.wte = nn.Embedding(V, d)
        self.wpe = nn.Embedding(seq, d) if m["positions"] == "learned" else None
        self.emb_p = m.get("emb_pdrop", 0.0)
        self.blocks = nn.ModuleList(Block(m, sdpa) for _ in range(m["n_layers"]))
        self.norm_f = make_norm(m)
        self.lm_head = None if m["tied_embeddings"] else nn.Linear(d, V, bias=False)
        nh = m["n_heads"]
        hs = m.get("head_dim", d // nh)
        i = torch.arange(seq)
        mask = torch.zeros(1, seq, seq).masked_fill(i[None, :] > i[:, None], float("-inf"))
        if m["positions"] == "alibi":  # one bias per head
            mask = mask + alibi_slopes(nh, m["alibi_bias_max"]).view(nh, 1, 1) * (i[None, :] - i[:, None]).float()
        self.register_buffer("mask", mask)
        if m["positions"] == "rope":
            inv_freq = 1.0 / (m["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
            emb = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq).repeat(1, 2)
            self.register_buffer("cos", emb.cos())
            self.register_buffer("sin", emb.sin())
        else:
            self.cos = self.sin = None
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=m["init_std"])

    def forward(self, idx, targets):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        x = drop(x, self.emb_p)
        pos = {"mask": self.mask, "cos": self.cos, "sin": self.sin}
        for b in self.blocks:
            x = b(x, pos)
        x = self.norm_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else x @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--anvil-json", required=True, help="the JSON line `anvil bench train` printed last")
    for name, default in [("steps", 10), ("warmup", 2), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--attention", default="manual", choices=["manual", "sdpa"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2); warm-up compiles")
    a = p.parse_args()
    run = json.loads(a.anvil_json)
    m, seq, batch, precision = run["model"], run["seq_len"], run["batch"], run["precision"]
    if precision not in ("fp32", "amp_bf16"):
        raise SystemExit(f"pytorch_decoder.py: precision {precision} is not compared (fp32 or amp_bf16)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(17)
    dev = torch.device("cuda" if run["kernels"] == "gpu" else "cpu")
    model = Decoder(m, seq, a.attention == "sdpa").to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    if a.compile:
        if not hasattr(torch, "compile"):
            raise SystemExit(f"pytorch_decoder.py: PyTorch {torch.__version__} has no torch.compile (2.0 and later)")
        model = torch.compile(model)
    stream = torch.randint(0, m["vocab_size"], (batch * seq + 1,))
    x, y = stream[:-1].view(batch, seq).to(dev), stream[1:].view(batch, seq).to(dev)
    cuda = dev.type == "cuda"

    def step():
        opt.zero_grad(set_to_none=True)
        if precision == "amp_bf16":
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
    row = {"tokens_per_s": batch * seq * a.steps / secs, "peak_rss_mib": rss, "loss": loss,
           "parameters": sum(p.numel() for p in model.parameters()),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "device": dev.type,
           "precision": precision, "attention": a.attention, "compiled": a.compile}
    if cuda:
        row["gpu_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(row))


if __name__ == "__main__":
    main()
