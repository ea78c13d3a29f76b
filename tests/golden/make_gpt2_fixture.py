#!/usr/bin/python3
"""Writes gpt2_tiny.safetensors, the golden fixture for anvil's GPT-2 against PyTorch.

Run with Debian's PyTorch:  /usr/bin/python3 tests/golden/make_gpt2_fixture.py
It builds a tiny GPT-2 in the same parameter layout anvil uses (per-layer tensors stacked on a
leading L dimension, tied embeddings), with fixed weights and a fixed batch (some targets set to
the ignore index -100), and records: the logits, the mean loss over non-ignored targets, every
parameter's gradient, then the loss, gradient norm and parameters through 10 steps of
torch.optim.AdamW (weight decay on matmul weights only), a linear warmup then cosine schedule as
Composer defines it, and global-norm clipping.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

L, NH, C, V, MAX_T = 2, 3, 24, 61, 12
B, T = 3, 9
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1
T_WARMUP, T_MAX, ALPHA_F, CLIP = 3, 10, 0.1, 0.5
NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
         "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAY = {"qkvw", "attprojw", "fcw", "fcprojw"}


def shapes():
    return {"wte": (V, C), "wpe": (MAX_T, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
            "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C),
            "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C),
            "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,)}


def forward(P, tokens):
    hs = C // NH
    x = P["wte"][tokens] + P["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], 1e-5)
        qkv = h @ P["qkvw"][l].T + P["qkvb"][l]
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], 1e-5)
        h = F.gelu(h @ P["fcw"][l].T + P["fcb"][l], approximate="tanh")
        x = x + h @ P["fcprojw"][l].T + P["fcprojb"][l]
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
    return x @ P["wte"].T


def lr_multiplier(t):
    if t < T_WARMUP:
        return t / T_WARMUP
    tau = min(1.0, (t - T_WARMUP) / (T_MAX - T_WARMUP))
    return ALPHA_F + (1 - ALPHA_F) * 0.5 * (1 + math.cos(math.pi * tau))


BLOCK = ["ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
         "fcprojw", "fcprojb"]


def flat(tensors):
    """anvil's flat layout: wte, wpe, then block 0's tensors, block 1's, ..., then lnfw, lnfb."""
    parts = [tensors["wte"], tensors["wpe"]]
    parts += [tensors[n][l] for l in range(L) for n in BLOCK]
    parts += [tensors["lnfw"], tensors["lnfb"]]
    return torch.cat([p.detach().reshape(-1) for p in parts])


def adamw_steps(params, decay, step_loss):
    """T_MAX steps of torch.optim.AdamW (weight decay WD on the tensors named in decay, none on the
    rest), the warmup-then-cosine schedule and global-norm clipping at CLIP; params maps names to
    tensors in the order the optimizer takes them, step_loss() gives the loss to step on. Returns
    each step's loss and gradient norm (before clipping) as float32 tensors."""
    opt = torch.optim.AdamW([{"params": [p for n, p in params.items() if n in decay], "weight_decay": WD},
                             {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier)
    losses, norms = [], []
    for _ in range(T_MAX):
        opt.zero_grad()
        loss = step_loss()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)))
        losses.append(float(loss))
        opt.step()
        sched.step()
    return torch.tensor(losses, dtype=torch.float32), torch.tensor(norms, dtype=torch.float32)


def write_safetensors(path, tensors, metadata):
    """Tensors in name order; F32 and I32, and BF16 and F16 (their bits through int16)."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16", torch.float16: "F16"}[t.dtype]
        data = (t.view(torch.int16) if dtype in ("BF16", "F16") else t).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    torch.manual_seed(20261122)
    P = {}
    for name, shape in shapes().items():
        if name.startswith("ln") and name.endswith("w"):
            P[name] = 1.0 + 0.1 * torch.randn(shape)
        elif name.endswith("b"):
            P[name] = 0.05 * torch.randn(shape)
        else:
            P[name] = 0.1 * torch.randn(shape)
        P[name].requires_grad_(True)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = torch.randint(0, V, (B,))
    targets[0, 2] = targets[2, 5] = targets[1, 8] = -100
    out = {"params_init": flat(P), "tokens": tokens.to(torch.int32), "targets": targets.to(torch.int32)}

    logits = forward(P, tokens)
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    out["grads"] = flat({n: P[n].grad for n in NAMES})

    out["step_losses"], out["step_grad_norms"] = adamw_steps(
        {n: P[n] for n in NAMES}, DECAY,
        lambda: F.cross_entropy(forward(P, tokens).view(-1, V), targets.view(-1), ignore_index=-100))
    out["params_final"] = flat(P)

    metadata = {"n_layers": L, "n_heads": NH, "d_model": C, "vocab_size": V, "max_seq_len": MAX_T,
                "batch": B, "seq_len": T, "lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS,
                "weight_decay": WD, "t_warmup": T_WARMUP, "steps": T_MAX, "alpha_f": ALPHA_F,
                "clip": CLIP, "torch": torch.__version__}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_tiny.safetensors")
    write_safetensors(path, out, {k: str(v) for k, v in metadata.items()})
    print(f"wrote {path}: loss {float(out['loss'][0]):.6f}, final step loss {float(out['step_losses'][-1]):.6f}")


if __name__ == "__main__":
    main()
