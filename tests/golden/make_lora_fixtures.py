#!/usr/bin/python3
"""Writes gpt2_lora_tiny.safetensors, llama_lora_tiny.safetensors, mpt_lora_tiny.safetensors and
mpt_moe_lora_tiny.safetensors, the golden fixtures for LoRA fine-tuning against PyTorch.

Run with Debian's PyTorch:  /usr/bin/python3 tests/golden/make_lora_fixtures.py
Each model is written here as transformers defines it, with each adapted linear layer computed as
PEFT's LoraLayer computes it: base(x) + lora_B(lora_A(x)) * scaling, scaling = lora_alpha / r
(lora_alpha / sqrt(r) with use_rslora), the base's weights frozen (no gradient, no optimizer
state) and only lora_A / lora_B trained. The batch has ignored targets (loss masking) and its first
sequence packs two examples: positions restart at the second, whose tokens attend only within it
(as packing_ratio packs them). B starts non-zero, so that A's gradient is not zero.
Each fixture holds the base's weights in anvil's flat layout ("base"), the adapters in anvil's
LoRA layout (block by block, each adapted module's A then B: "params_init"), the packed
positions, the logits, the mean loss, the adapters' gradients, and, as the other fixtures, the
loss, gradient norm and adapters through 10 steps of torch.optim.AdamW with weight decay on the
adapters, the warmup-then-cosine schedule and clipping.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt2_fixture import ALPHA_F, BETAS, CLIP, EPS, LR, T_MAX, T_WARMUP, WD  # noqa: E402
from make_gpt2_fixture import adamw_steps, write_safetensors  # noqa: E402
from make_family_fixtures import alibi_slopes, cat, moe_mlp, rms_norm, rotate_half  # noqa: E402

B, T, V, MAX_T, L = 3, 9, 61, 12, 2
# Sequence 0 packs an example of 4 tokens and one of 5.
POSITIONS = torch.stack([torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])] + [torch.arange(T)] * (B - 1))


def batch():
    tokens = torch.randint(0, V, (B, T))
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = torch.randint(0, V, (B,))
    targets[0, 2] = targets[2, 5] = targets[1, 8] = -100
    targets[0, 3] = -100  # the first packed example's last token predicts nothing of the next
    return tokens, targets


class Lora:
    """The adapters of the targeted modules: A (L, r, in) and B (L, out, r) each."""

    def __init__(self, r, alpha, rslora, modules):
        self.r, self.scaling = r, (alpha / math.sqrt(r) if rslora else alpha / r)
        self.A, self.B = {}, {}
        for name, (out_features, in_features) in modules.items():
            bound = 1 / math.sqrt(in_features)
            self.A[name] = (torch.rand(L, r, in_features) * 2 - 1) * bound
            self.B[name] = 0.1 * torch.randn(L, out_features, r)
            self.A[name].requires_grad_(True)
            self.B[name].requires_grad_(True)

    def linear(self, P, name, l, x, bias=None):
        y = x @ P[name][l].T
        if bias is not None:
            y = y + P[bias][l]
        if name in self.A:
            y = y + (x @ self.A[name][l].T) @ self.B[name][l].T * self.scaling
        return y

    def named(self):
        out = {}
        for name in self.A:
            out[name + ".A"], out[name + ".B"] = self.A[name], self.B[name]
        return out

    def flat(self, order, get):
        return torch.cat([get(t)[l].detach().reshape(-1) for l in range(L) for n in order if n in self.A
                          for t in (self.A[n], self.B[n])])


def attention(q, k, v, alibi_slopes=None):
    """q, k, v (B,NH,T,hs): softmax attention, each query seeing the keys of its own example up to
    itself (POSITIONS), scale 1/sqrt(hs), with ALiBi's slope * (j - i) when given."""
    hs = q.shape[-1]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    if alibi_slopes is not None:
        s = s + alibi_slopes.view(1, -1, 1, 1) * (j - i).float()
    start = (torch.arange(T) - POSITIONS).view(B, 1, T, 1)
    allowed = (j <= i) & (j >= start)
    return s.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v




def heads(x, n):
    return x.view(B, T, n, -1).transpose(1, 2)


def gpt2(P, lora, tokens, NH, C):
    x = P["wte"][tokens] + P["wpe"][POSITIONS]
    for l in range(L):
        h = F.layer_norm(x, (C,), P["ln_1"][l], P["ln_1.b"][l], 1e-5)
        q, k, v = (heads(t, NH) for t in lora.linear(P, "c_attn", l, h, "c_attn.b").split(C, dim=-1))
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + lora.linear(P, "attn.c_proj", l, y, "attn.c_proj.b")
        h = F.layer_norm(x, (C,), P["ln_2"][l], P["ln_2.b"][l], 1e-5)
        h = F.gelu(lora.linear(P, "c_fc", l, h, "c_fc.b"), approximate="tanh")
        x = x + lora.linear(P, "mlp.c_proj", l, h, "mlp.c_proj.b")
    return F.layer_norm(x, (C,), P["ln_f"], P["ln_f.b"], 1e-5) @ P["wte"].T


def mpt_attention(P, lora, l, x, slopes, NH, C):
    """An MPT block's attention half: the residual stream after it."""
    h = F.layer_norm(x, (C,), P["norm_1"][l], None, 1e-5)
    q, k, v = (heads(t, NH) for t in lora.linear(P, "Wqkv", l, h).split(C, dim=-1))
    y = attention(q, k, v, slopes).transpose(1, 2).reshape(B, T, C)
    return x + lora.linear(P, "out_proj", l, y)


def mpt(P, lora, tokens, NH, C):
    x = P["wte"][tokens]
    slopes = alibi_slopes(NH, 8)
    for l in range(L):
        x = mpt_attention(P, lora, l, x, slopes, NH, C)
        h = F.layer_norm(x, (C,), P["norm_2"][l], None, 1e-5)
        x = x + lora.linear(P, "down_proj", l, F.gelu(lora.linear(P, "up_proj", l, h)))
    return F.layer_norm(x, (C,), P["norm_f"], None, 1e-5) @ P["wte"].T


def mpt_moe(P, lora, tokens, targets, NH, C, E, K, capacity):
    """An MPT whose MLPs are mixtures of experts (make_family_fixtures.mpt_moe: GELU experts, the
    balancing loss with weight 0.1), with PEFT's branch on the linear layers all-linear finds:
    Wqkv, out_proj and MegaBlocks' router (router.layer; the experts are weights, not layers).
    Returns the logits and the balancing loss."""
    x = P["wte"][tokens]
    slopes = alibi_slopes(NH, 8)
    n_targets = (targets != -100).sum(dim=1).to(torch.float32)  # per sequence
    balance = 0.0
    for l in range(L):
        x = mpt_attention(P, lora, l, x, slopes, NH, C)
        h = F.layer_norm(x, (C,), P["norm_2"][l], None, 1e-5)
        out, lbl = moe_mlp(P, l, h, lora.linear(P, "router", l, h), E, K, capacity, 0.0, False, 0.1, MAX_T)
        x = x + out
        balance = balance + (lbl * n_targets).sum() / (L * n_targets.sum())
    return F.layer_norm(x, (C,), P["norm_f"], None, 1e-5) @ P["wte"].T, balance


def llama(P, lora, tokens, NH, NKV, C, theta, eps):
    hs = C // NH
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    freqs = POSITIONS.float().unsqueeze(-1) * inv_freq  # (B,T,hs/2)
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # (B,1,T,hs)
    cos, sin = emb.cos(), emb.sin()
    x = P["embed_tokens"][tokens]
    for l in range(L):
        h = rms_norm(x, P["input_layernorm"][l], eps)
        q = heads(lora.linear(P, "q_proj", l, h), NH)
        k = heads(lora.linear(P, "k_proj", l, h), NKV)
        v = heads(lora.linear(P, "v_proj", l, h), NKV)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        g = NH // NKV
        k = k[:, :, None].expand(B, NKV, g, T, hs).reshape(B, NH, T, hs)
        v = v[:, :, None].expand(B, NKV, g, T, hs).reshape(B, NH, T, hs)
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + lora.linear(P, "o_proj", l, y)
        h = rms_norm(x, P["post_attention_layernorm"][l], eps)
        x = x + lora.linear(P, "down_proj", l, F.silu(lora.linear(P, "gate_proj", l, h)) *
                            lora.linear(P, "up_proj", l, h))
    return rms_norm(x, P["norm"], eps) @ P["lm_head"].T


def base_params(shapes):
    P = {}
    for name, shape in shapes.items():
        if "norm" in name or name.startswith("ln_"):
            P[name] = 0.05 * torch.randn(shape) if name.endswith(".b") else 1.0 + 0.1 * torch.randn(shape)
        else:
            P[name] = (0.05 if name.endswith(".b") else 0.1) * torch.randn(shape)
    return P




def write(name, P, base_flat, lora, order, forward, model_yaml):
    """forward(P, lora, tokens, targets) returns the logits, or the logits and an auxiliary loss
    that training adds to the mean cross-entropy (a mixture of experts' balancing loss)."""
    tokens, targets = batch()
    adapters = lora.named()

    def loss_of():
        out = forward(P, lora, tokens, targets)
        logits, aux = out if isinstance(out, tuple) else (out, None)
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100), aux

    logits, loss, aux = loss_of()
    (loss if aux is None else loss + aux).backward()
    # loss: the cross-entropy alone (what evaluation reports); balance_loss: what training adds.
    out = {"base": base_flat, "params_init": lora.flat(order, lambda t: t), "tokens": tokens.to(torch.int32),
           "targets": targets.to(torch.int32), "positions": POSITIONS.to(torch.int32), "logits": logits.detach(),
           "loss": loss.detach().reshape(1), "grads": lora.flat(order, lambda t: t.grad)}
    if aux is not None:
        out["balance_loss"] = aux.detach().reshape(1)

    def training_loss():
        _, ce, aux = loss_of()
        return ce if aux is None else ce + aux

    # PEFT leaves the base frozen: only the adapters are the optimizer's, and all of them decay.
    out["step_losses"], out["step_grad_norms"] = adamw_steps(adapters, set(adapters), training_loss)
    out["params_final"] = lora.flat(order, lambda t: t)
    meta = {"batch": B, "seq_len": T, "model_yaml": model_yaml, "torch": torch.__version__, "lr": LR,
            "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS, "weight_decay": WD, "t_warmup": T_WARMUP,
            "steps": T_MAX, "alpha_f": ALPHA_F, "clip": CLIP}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    write_safetensors(path, out, {k: str(v) for k, v in meta.items()})
    print(f"wrote {path}: loss {float(loss):.6f}, final step loss {float(out['step_losses'][-1]):.6f}")


def main():
    torch.manual_seed(20261126)
    # GPT-2, every linear layer adapted (attention's and the MLP's c_proj by one name), r 4, alpha 8.
    NH, C = 3, 24
    P = base_params({"wte": (V, C), "wpe": (MAX_T, C), "ln_1": (L, C), "ln_1.b": (L, C), "c_attn": (L, 3 * C, C),
                     "c_attn.b": (L, 3 * C), "attn.c_proj": (L, C, C), "attn.c_proj.b": (L, C), "ln_2": (L, C),
                     "ln_2.b": (L, C), "c_fc": (L, 4 * C, C), "c_fc.b": (L, 4 * C), "mlp.c_proj": (L, C, 4 * C),
                     "mlp.c_proj.b": (L, C), "ln_f": (C,), "ln_f.b": (C,)})
    block = ["ln_1", "ln_1.b", "c_attn", "c_attn.b", "attn.c_proj", "attn.c_proj.b", "ln_2", "ln_2.b", "c_fc",
             "c_fc.b", "mlp.c_proj", "mlp.c_proj.b"]
    order = ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]
    lora = Lora(4, 8, False, {"c_attn": (3 * C, C), "attn.c_proj": (C, C), "c_fc": (4 * C, C),
                              "mlp.c_proj": (C, 4 * C)})
    write("gpt2_lora_tiny.safetensors", P,
          cat([P["wte"], P["wpe"]] + [P[n][l] for l in range(L) for n in block] + [P["ln_f"], P["ln_f.b"]]),
          lora, order, lambda P, lora, tokens, targets: gpt2(P, lora, tokens, NH, C),
          f"name: gpt2\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\nmax_seq_len: {MAX_T}\n"
          "peft_config:\n  peft_type: LORA\n  r: 4\n  lora_alpha: 8\n  target_modules: [c_attn, c_proj, c_fc]\n")

    # Llama with grouped-query heads (4 over 2) and its own head; q, v, o, gate and down adapted
    # (k and up not: rows of the fused products left alone), r 2, alpha 6, rsLoRA scaling.
    NH, NKV, C, FF, THETA, EPS_RMS = 4, 2, 32, 40, 10000.0, 1e-5
    hs = C // NH
    P = base_params({"embed_tokens": (V, C), "input_layernorm": (L, C), "q_proj": (L, C, C),
                     "k_proj": (L, NKV * hs, C), "v_proj": (L, NKV * hs, C), "o_proj": (L, C, C),
                     "post_attention_layernorm": (L, C), "gate_proj": (L, FF, C), "up_proj": (L, FF, C),
                     "down_proj": (L, C, FF), "norm": (C,), "lm_head": (V, C)})
    block = ["input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm", "gate_proj",
             "up_proj", "down_proj"]
    order = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = Lora(2, 6, True, {"q_proj": (C, C), "v_proj": (NKV * hs, C), "o_proj": (C, C), "gate_proj": (FF, C),
                             "down_proj": (C, FF)})
    write("llama_lora_tiny.safetensors", P,
          cat([P["embed_tokens"]] + [P[n][l] for l in range(L) for n in block] + [P["norm"], P["lm_head"]]),
          lora, order, lambda P, lora, tokens, targets: llama(P, lora, tokens, NH, NKV, C, THETA, EPS_RMS),
          f"name: llama\nn_layers: {L}\nn_heads: {NH}\nn_kv_heads: {NKV}\nd_model: {C}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nintermediate_size: {FF}\nrope_theta: {THETA}\nrms_norm_eps: {EPS_RMS}\n"
          "tie_word_embeddings: false\npeft_config:\n  peft_type: LORA\n  r: 2\n  lora_alpha: 6\n"
          "  use_rslora: true\n  target_modules: [q_proj, v_proj, o_proj, gate_proj, down_proj]\n")

    # MPT (six ALiBi heads, no biases, tied): all-linear, r 3, alpha 3.
    NH, C = 6, 24
    P = base_params({"wte": (V, C), "norm_1": (L, C), "Wqkv": (L, 3 * C, C), "out_proj": (L, C, C),
                     "norm_2": (L, C), "up_proj": (L, 4 * C, C), "down_proj": (L, C, 4 * C), "norm_f": (C,)})
    block = ["norm_1", "Wqkv", "out_proj", "norm_2", "up_proj", "down_proj"]
    order = ["Wqkv", "out_proj", "up_proj", "down_proj"]
    lora = Lora(3, 3, False, {"Wqkv": (3 * C, C), "out_proj": (C, C), "up_proj": (4 * C, C), "down_proj": (C, 4 * C)})
    write("mpt_lora_tiny.safetensors", P,
          cat([P["wte"]] + [P[n][l] for l in range(L) for n in block] + [P["norm_f"]]),
          lora, order, lambda P, lora, tokens, targets: mpt(P, lora, tokens, NH, C),
          f"name: mpt_causal_lm\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nexpansion_ratio: 4\nno_bias: true\nattn_config:\n  alibi: true\n"
          "peft_config:\n  peft_type: LORA\n  r: 3\n  lora_alpha: 3\n  target_modules: all-linear\n")

    # An MPT whose MLPs are mixtures of experts (mb_moe: four GELU experts, top 2, capacity factor
    # 0.75: 4 choices of an expert per sequence, some skipped), all-linear: Wqkv, out_proj and the
    # router adapted, the experts frozen; r 2, alpha 4.
    NH, C, E, K, FF = 4, 24, 4, 2, 32
    P = base_params({"wte": (V, C), "norm_1": (L, C), "Wqkv": (L, 3 * C, C), "out_proj": (L, C, C),
                     "norm_2": (L, C), "router": (L, E, C), "w1": (L, E, FF, C), "w2": (L, E, C, FF),
                     "norm_f": (C,)})
    block = ["norm_1", "Wqkv", "out_proj", "norm_2", "router", "w1", "w2"]
    order = ["Wqkv", "out_proj", "router"]
    lora = Lora(2, 4, False, {"Wqkv": (3 * C, C), "out_proj": (C, C), "router": (E, C)})
    write("mpt_moe_lora_tiny.safetensors", P,
          cat([P["wte"]] + [P[n][l] for l in range(L) for n in block] + [P["norm_f"]]),
          lora, order, lambda P, lora, tokens, targets: mpt_moe(P, lora, tokens, targets, NH, C, E, K, 0.75),
          f"name: mpt_causal_lm\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nno_bias: true\nattn_config:\n  alibi: true\nffn_config:\n  ffn_type: mb_moe\n"
          f"  moe_num_experts: {E}\n  moe_top_k: {K}\n  ffn_hidden_size: {FF}\n  moe_capacity_factor: 0.75\n"
          "peft_config:\n  peft_type: LORA\n  r: 2\n  lora_alpha: 4\n  target_modules: all-linear\n")


if __name__ == "__main__":
    main()
