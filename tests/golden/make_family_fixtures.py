#!/usr/bin/python3
"""Writes the golden fixtures for anvil's MPT, Llama and Qwen2 families against PyTorch: mpt_tiny,
llama_tiny, llama_mqa_tiny, mpt_qkln_tiny, mpt_qkln_rope_tiny, qwen2_tiny, qwen3_tiny,
mistral_window_tiny, and the mixtures of experts mpt_moe_tiny, mpt_dmoe_glu_tiny, mixtral_tiny and
qwen3_moe_tiny (.safetensors).

Run with Debian's PyTorch:  /usr/bin/python3 tests/golden/make_family_fixtures.py [qwen3_moe]
(qwen3_moe: that fixture alone.)
Each model is written here from the published definitions, not from anvil's code:
- MPT as LLM Foundry / Hugging Face's MptForCausalLM compute it with alibi: true, no_bias: true:
  LayerNorms without bias, fused Wqkv, ALiBi added to the scaled scores as slope * (j - (T-1))
  with Foundry's gen_slopes (interleaved for a head count that is not a power of two), exact
  GELU, tied LM head.
- Llama as Hugging Face's LlamaForCausalLM: RMSNorm (x * rsqrt(mean(x^2) + eps) * w), q/k/v
  projections with grouped key/value heads (repeat_kv), RoPE in the rotate-half convention,
  SwiGLU MLP (down(silu(gate(x)) * up(x))), an untied lm_head, no biases.
- Qwen2 as Hugging Face's Qwen2ForCausalLM: Llama's computation with biases on the q, k and v
  projections (none on o_proj or the MLP).
- Mixtral as Hugging Face's MixtralForCausalLM: Llama's computation with each MLP a sparse block
  (MixtralSparseMoeBlock): router logits from the bias-free gate, softmax, the top K
  probabilities renormalised to sum to 1, and the chosen experts' w2(silu(w1 x) * w3 x) summed
  by those weights; no router loss (output_router_logits off).
- Qwen3-MoE as Hugging Face's Qwen3MoeForCausalLM: Qwen3's attention (an RMSNorm over each
  head's queries and keys before RoPE) with Mixtral's sparse block, the chosen experts weighted
  by their softmax probabilities as they are (norm_topk_prob: false, Qwen3MoeConfig's default).
Each fixture holds the parameters flattened in anvil's layout order (q/k/v rows fused as anvil's
qkvw, gate/up rows as its fcw), a batch with ignored targets, the logits, the mean loss, every
gradient in the same layout, and the model section of the anvil config that builds the model;
then, as the GPT-2 fixture, the loss, gradient norm and parameters through 10 steps of
torch.optim.AdamW (weight decay on the product weights, the LM head's included; none on norms
and embeddings), Composer's warmup-then-cosine schedule and global-norm clipping.
Six models: an MPT (six ALiBi heads), a Llama with grouped-query heads (4 over 2) and its own LM
head, a multi-query Llama (4 heads over 1) with a tied head, two MPTs with LLM Foundry's
attn_config.qk_ln (its GroupedQueryAttention: the block's norm over all the queries and over all
the keys of a position, before the heads split and before RoPE): grouped-query ALiBi heads under
RMSNorm, and multi-query RoPE heads with biases everywhere; and a Qwen2 (4 heads over 2, tied,
q/k/v biases).
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt2_fixture import ALPHA_F, BETAS, CLIP, EPS, LR, T_MAX, T_WARMUP, WD  # noqa: E402
from make_gpt2_fixture import adamw_steps, write_safetensors  # noqa: E402

B, T, V, MAX_T = 3, 9, 61, 12


def alibi_slopes(n_heads, bias_max):
    n = 2 ** math.ceil(math.log2(n_heads))
    m = torch.arange(1, n + 1, dtype=torch.float32) * (bias_max / n)
    slopes = 1.0 / torch.pow(2, m)
    if n != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def attention(q, k, v, bias=None, window=0):
    """q (B,NH,T,hs), k and v (B,NH,T,hs): causal softmax attention, scale 1/sqrt(hs); with a
    sliding window, key j is seen from query i when j > i - window (transformers' Mistral mask)."""
    hs = q.shape[-1]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    if bias is not None:
        s = s + bias
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if window:
        mask &= torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=-(window - 1))
    return s.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def rope_tables(hs, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def mpt(P, tokens, L, NH, C, KV=None, qk_ln=False, rope=False, rms=False):
    """LLM Foundry's MPTForCausalLM. KV: kv_n_heads (grouped-query attention; None: NH). qk_ln:
    attn_config.qk_ln, the block's norm over all the queries (C) and all the keys (KV·hs) before
    the heads split and before RoPE. rope: rotate-half RoPE (theta 10000) instead of ALiBi. rms:
    norm_type rmsnorm. Biases where P has them (no_bias: false)."""
    hs, KV = C // NH, KV or NH
    g = P.get
    lin = lambda h, n, l: F.linear(h, P[n][l], g(n + ".bias")[l] if n + ".bias" in P else None)

    def norm(h, n, l=None):
        w, b = (P[n], g(n + ".bias")) if l is None else (P[n][l], g(n + ".bias")[l] if n + ".bias" in P else None)
        return rms_norm(h, w, 1e-5) if rms else F.layer_norm(h, (h.shape[-1],), w, b, 1e-5)

    x = P["wte"][tokens]
    bias = None if rope else (alibi_slopes(NH, 8).view(1, NH, 1, 1) *
                              torch.arange(1 - T, 1, dtype=torch.float32).view(1, 1, 1, T))
    cos, sin = rope_tables(hs, 10000.0)
    for l in range(L):
        h = norm(x, "norm_1", l)
        q, k, v = lin(h, "Wqkv", l).split([C, KV * hs, KV * hs], dim=-1)
        if qk_ln:
            q, k = norm(q, "q_ln", l), norm(k, "k_ln", l)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k, v = (t.view(B, T, KV, hs).transpose(1, 2) for t in (k, v))
        if rope:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # Foundry's repeat_kv_for_gqa: query head i reads key/value head i // (NH / KV).
        k, v = (t[:, :, None].expand(B, KV, NH // KV, T, hs).reshape(B, NH, T, hs) for t in (k, v))
        y = attention(q, k, v, bias).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, "out_proj", l)
        h = norm(x, "norm_2", l)
        x = x + lin(F.gelu(lin(h, "up_proj", l)), "down_proj", l)
    return norm(x, "norm_f") @ P["wte"].T


def moe_mlp(P, l, h, logits, E, K, capacity, norm_p, glu, loss_weight, max_seq_len):
    """Layer l's mixture of experts (mpt_moe) over h (B,T,C) from its router logits (B,T,E): the
    output, and each sequence's balancing loss (B,) before the layers' average."""
    probs = logits.softmax(dim=-1)  # (B,T,E)
    weights, chosen = torch.topk(probs, K, dim=-1)  # (B,T,K)
    if norm_p:
        weights = weights / torch.norm(weights, p=norm_p, dim=-1, keepdim=True)
    kept = torch.ones(B, T, K, dtype=torch.bool)
    if capacity:
        cap = int(capacity * K * max_seq_len / E) or B * T * K
        for b in range(B):
            used = [0] * E
            for t in range(T):
                for j in range(K):
                    e = int(chosen[b, t, j])
                    kept[b, t, j] = used[e] < cap
                    used[e] += 1
    out = torch.zeros_like(h)
    for e in range(E):
        gate = ((chosen == e) & kept).to(torch.float32) * weights  # (B,T,K)
        a = h @ P["w1"][l, e].T
        a = F.silu(a) * (h @ P["v1"][l, e].T) if glu else F.gelu(a, approximate="tanh")
        out = out + gate.sum(-1, keepdim=True) * (a @ P["w2"][l, e].T)
    counts = F.one_hot(chosen, E).sum(dim=(1, 2)).to(torch.float32)  # (B,E), before capacity
    return out, loss_weight * E / (K * T * T) * (counts * probs.sum(dim=1)).sum(dim=1)


def mpt_moe(P, tokens, L, NH, C, E, K, capacity, norm_p, glu, loss_weight, targets, max_seq_len):
    """MPT whose MLPs are MegaBlocks mixtures of experts (LLM Foundry's ffn_type mb_moe / mb_dmoe),
    written from MegaBlocks' definition: a bias-free router linear, softmax over the experts, the
    top K by probability, their weights divided by their norm_p-norm (when given), each expert an
    MLP without biases (w1 (F,C), w2 (C,F); glu: silu(x·w1ᵀ)·(x·v1ᵀ) with v1 (F,C), else GELU in
    its tanh form, MegaBlocks' default), the outputs summed by weight. anvil routes, caps and
    balances a sequence at a time: with a capacity factor an expert takes at most
    int(factor·K·max_seq_len/E) of a sequence's choices (MegaBlocks' truncation of a training
    sequence's; no limit where that is 0), in (position, rank) order, and a skipped choice adds
    nothing; the balancing loss of a sequence is MegaBlocks' loss_weight·E/(K·T²)·Σ_e n_e·Σ_t p_te
    (n_e its choices of e before capacity), averaged over the layers and counted once per target
    of the sequence, as the cross-entropy is. Returns the logits and the balancing loss to add to
    the mean cross-entropy."""
    hs = C // NH
    x = P["wte"][tokens]
    bias = alibi_slopes(NH, 8).view(1, NH, 1, 1) * torch.arange(1 - T, 1, dtype=torch.float32).view(1, 1, 1, T)
    n_targets = (targets != -100).sum(dim=1).to(torch.float32)  # per sequence
    balance = 0.0
    for l in range(L):
        h = F.layer_norm(x, (C,), P["norm_1"][l], None, 1e-5)
        q, k, v = (h @ P["Wqkv"][l].T).split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, bias).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P["out_proj"][l].T
        h = F.layer_norm(x, (C,), P["norm_2"][l], None, 1e-5)
        out, lbl = moe_mlp(P, l, h, h @ P["router"][l].T, E, K, capacity, norm_p, glu, loss_weight, max_seq_len)
        x = x + out
        balance = balance + (lbl * n_targets).sum() / (L * n_targets.sum())
    return F.layer_norm(x, (C,), P["norm_f"], None, 1e-5) @ P["wte"].T, balance


def write_mpt_moe():
    """Two MPTs with mixture-of-experts MLPs: mb_moe (four GELU experts, top 2, capacity factor
    0.75, so 4 choices of an expert per sequence in a pass of 9 tokens shorter than max_seq_len:
    some choices skipped, weights normalised by their 1-norm) and mb_dmoe (three SwiGLU
    experts, top 1, dropless)."""
    L, NH, C, FF = 2, 4, 24, 32
    for name, E, K, capacity, norm_p, glu in [("mpt_moe_tiny.safetensors", 4, 2, 0.75, 1.0, False),
                                              ("mpt_dmoe_glu_tiny.safetensors", 3, 1, 0.0, 0.0, True)]:
        shapes = {"wte": (V, C), "norm_1": (L, C), "Wqkv": (L, 3 * C, C), "out_proj": (L, C, C), "norm_2": (L, C),
                  "router": (L, E, C), "w1": (L, E, FF, C), "w2": (L, E, C, FF), "norm_f": (C,)}
        if glu:
            shapes["v1"] = (L, E, FF, C)
        P = make_params(shapes)
        tokens, targets = batch()

        def flat(g, glu=glu):
            parts = [g("wte")]
            for l in range(L):
                # anvil's fused first product: each expert's gate rows, then its up rows.
                w1 = torch.cat([g("w1")[l], g("v1")[l]], dim=1) if glu else g("w1")[l]
                parts += [g("norm_1")[l], g("Wqkv")[l], g("out_proj")[l], g("norm_2")[l], g("router")[l], w1,
                          g("w2")[l]]
            return cat(parts + [g("norm_f")])

        def forward(P, tokens, E=E, K=K, capacity=capacity, norm_p=norm_p, glu=glu):
            return mpt_moe(P, tokens, L, NH, C, E, K, capacity, norm_p, glu, 0.1, targets, MAX_T)

        ffn = (f"ffn_config:\n  ffn_type: {'mb_moe' if capacity else 'mb_dmoe'}\n  moe_num_experts: {E}\n"
               f"  moe_top_k: {K}\n  ffn_hidden_size: {FF}\n  moe_loss_weight: 0.1\n" +
               (f"  moe_capacity_factor: {capacity}\n" if capacity else "") +
               (f"  moe_normalize_expert_weights: {norm_p}\n" if norm_p else "") +
               ("  mlp_type: glu\n  ffn_act_fn:\n    name: silu\n" if glu else ""))
        write(name, P, flat, forward,
              f"name: mpt_causal_lm\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\n"
              f"max_seq_len: {MAX_T}\nno_bias: true\nattn_config:\n  alibi: true\n" + ffn,
              {"Wqkv", "out_proj", "router", "w1", "v1", "w2"}, batch_of=(tokens, targets))


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def llama(P, tokens, L, NH, NKV, C, theta, eps, head, hs=None, window=0):
    """hs: the head size (default C // NH); P's q_bias/k_bias/v_bias (Qwen2) and q_norm/k_norm
    (Qwen3: an RMSNorm over each head's channels before RoPE) where it has them; window: Mistral's
    sliding window."""
    hs = hs or C // NH
    cos, sin = rope_tables(hs, theta)
    x = P["embed_tokens"][tokens]
    for l in range(L):
        h = rms_norm(x, P["input_layernorm"][l], eps)
        q, k, v = (h @ P[n + "_proj"][l].T + (P[n + "_bias"][l] if n + "_bias" in P else 0) for n in "qkv")
        q, k, v = q.view(B, T, NH, hs), k.view(B, T, NKV, hs), v.view(B, T, NKV, hs)
        if "q_norm" in P:
            q, k = rms_norm(q, P["q_norm"][l], eps), rms_norm(k, P["k_norm"][l], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        g = NH // NKV
        k = k[:, :, None].expand(B, NKV, g, T, hs).reshape(B, NH, T, hs)
        v = v[:, :, None].expand(B, NKV, g, T, hs).reshape(B, NH, T, hs)
        y = attention(q, k, v, window=window).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + y @ P["o_proj"][l].T
        h = rms_norm(x, P["post_attention_layernorm"][l], eps)
        if "gate" in P:
            x = x + mixtral_sparse_block(P, l, h)
            continue
        x = x + (F.silu(h @ P["gate_proj"][l].T) * (h @ P["up_proj"][l].T)) @ P["down_proj"][l].T
    return rms_norm(x, P["norm"], eps) @ P[head].T


def mixtral_sparse_block(P, l, h):
    """transformers' MixtralSparseMoeBlock over h (B,T,C): P's gate (L,E,C), w1 and w3 (L,E,F,C),
    w2 (L,E,C,F); K = P["top_k"]; the chosen probabilities renormalised unless P["norm_topk"] is
    False (Qwen3MoeSparseMoeBlock's norm_topk_prob)."""
    weights = F.softmax(h @ P["gate"][l].T, dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(weights, P["top_k"], dim=-1)
    if P.get("norm_topk", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(P["gate"].shape[1]):
        w = (weights * (chosen == e)).sum(dim=-1, keepdim=True)
        out = out + w * ((F.silu(h @ P["w1"][l, e].T) * (h @ P["w3"][l, e].T)) @ P["w2"][l, e].T)
    return out


def make_params(shapes):
    P = {}
    for name, shape in shapes.items():
        norm = "norm" in name or "layernorm" in name or name.endswith("_ln")
        P[name] = (1.0 + 0.1 * torch.randn(shape)) if norm else 0.1 * torch.randn(shape)
        P[name].requires_grad_(True)
    return P


def batch():
    tokens = torch.randint(0, V, (B, T))
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = torch.randint(0, V, (B,))
    targets[0, 2] = targets[2, 5] = targets[1, 8] = -100
    return tokens, targets


def write(name, P, flat, forward, model_yaml, decay, batch_of=None, sensitive=False):
    """decay: the names of the tensors AdamW decays. forward returns the logits, or the logits and
    an auxiliary loss that training adds to the mean cross-entropy (batch_of: the batch, when the
    forward pass needs its targets). sensitive: a model whose 10 steps amplify rounding (top-k
    routing near ties): the fixture records how far PyTorch's own final weights move when the
    initial weights are perturbed by 1e-6 relative (two draws; the largest relative change of a
    tensor) as the tolerance of anvil's final weights."""
    tokens, targets = batch_of or batch()
    initial = {n: p.detach().clone() for n, p in P.items()}

    def loss_of(P):
        out = forward(P, tokens)
        logits, aux = out if isinstance(out, tuple) else (out, None)
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100), aux

    logits, loss, aux = loss_of(P)
    (loss if aux is None else loss + aux).backward()
    # loss: the cross-entropy alone (what evaluation reports); balance_loss: the auxiliary loss
    # that training adds to it.
    out = {"params_init": flat(lambda n: P[n]), "tokens": tokens.to(torch.int32),
           "targets": targets.to(torch.int32), "logits": logits.detach(), "loss": loss.detach().reshape(1),
           "grads": flat(lambda n: P[n].grad)}
    if aux is not None:
        out["balance_loss"] = aux.detach().reshape(1)

    def training_loss():
        _, ce, aux = loss_of(P)
        return ce if aux is None else ce + aux

    out["step_losses"], out["step_grad_norms"] = adamw_steps(P, decay, training_loss)
    out["params_final"] = flat(lambda n: P[n])
    spread = 0.0
    if sensitive:
        draws = torch.Generator().manual_seed(1)
        for _ in range(2):
            Q = {n: (p * (1 + 1e-6 * torch.randn(p.shape, generator=draws))).requires_grad_(True)
                 for n, p in initial.items()}
            adamw_steps(Q, decay, lambda: F.cross_entropy(forward(Q, tokens).view(-1, V), targets.view(-1),
                                                          ignore_index=-100))
            spread = max([spread] + [float((Q[n] - P[n]).norm() / P[n].norm()) for n in P])

    meta = {"batch": B, "seq_len": T, "model_yaml": model_yaml, "torch": torch.__version__, "lr": LR,
            "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS, "weight_decay": WD, "t_warmup": T_WARMUP,
            "steps": T_MAX, "alpha_f": ALPHA_F, "clip": CLIP}
    if sensitive:
        meta["params_final_tolerance"] = spread
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    write_safetensors(path, out, {k: str(v) for k, v in meta.items()})
    print(f"wrote {path}: loss {float(loss):.6f}, final step loss {float(out['step_losses'][-1]):.6f}")


def cat(parts):
    return torch.cat([p.detach().reshape(-1) for p in parts])


def main():
    torch.manual_seed(20261125)
    # MPT: six heads (slopes interleaved from eight), no biases, ALiBi, exact GELU, tied.
    L, NH, C = 2, 6, 24
    P = make_params({"wte": (V, C), "norm_1": (L, C), "Wqkv": (L, 3 * C, C), "out_proj": (L, C, C),
                     "norm_2": (L, C), "up_proj": (L, 4 * C, C), "down_proj": (L, C, 4 * C), "norm_f": (C,)})
    block = ["norm_1", "Wqkv", "out_proj", "norm_2", "up_proj", "down_proj"]
    write("mpt_tiny.safetensors", P,
          lambda g: cat([g("wte")] + [g(n)[l] for l in range(L) for n in block] + [g("norm_f")]),
          lambda P, tokens: mpt(P, tokens, L, NH, C),
          f"name: mpt_causal_lm\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nexpansion_ratio: 4\nno_bias: true\nattn_config:\n  alibi: true\n",
          {"Wqkv", "out_proj", "up_proj", "down_proj"})
    # Llama: four query heads over two key/value heads, SwiGLU of 40, RoPE theta 10000, untied;
    # then multi-query (one key/value head) with a tied head.
    for name, NKV, tied in [("llama_tiny.safetensors", 2, False), ("llama_mqa_tiny.safetensors", 1, True)]:
        write_llama(name, NKV, tied)
    write_mpt_qk_ln()
    write_llama("qwen2_tiny.safetensors", 2, True, qkv_bias=True)
    write_llama("qwen3_tiny.safetensors", 2, True, qk_norm=True, hs=16)
    write_llama("mistral_window_tiny.safetensors", 2, False, window=4)
    torch.manual_seed(20261128)
    write_mpt_moe()
    torch.manual_seed(20261129)
    write_mixtral()
    torch.manual_seed(20261130)
    write_qwen3_moe()


def write_qwen3_moe():
    """A Qwen3-MoE: four query heads of 16 over two key/value heads (queries 64 wide over a width
    of 32), per-head q/k norms, four SwiGLU experts of 24, top 2, the chosen probabilities as they
    are, an untied head."""
    L, NH, NKV, C, HS, FF, E, K, THETA, EPS_RMS = 2, 4, 2, 32, 16, 24, 4, 2, 10000.0, 1e-6
    P = make_params({"embed_tokens": (V, C), "input_layernorm": (L, C), "q_norm": (L, HS), "k_norm": (L, HS),
                     "q_proj": (L, NH * HS, C), "k_proj": (L, NKV * HS, C), "v_proj": (L, NKV * HS, C),
                     "o_proj": (L, C, NH * HS), "post_attention_layernorm": (L, C), "gate": (L, E, C),
                     "w1": (L, E, FF, C), "w3": (L, E, FF, C), "w2": (L, E, C, FF), "norm": (C,),
                     "lm_head": (V, C)})

    def flat(g):
        parts = [g("embed_tokens")]
        for l in range(L):
            # w1, w3 and w2 stand for each expert's gate_proj, up_proj and down_proj.
            parts += [g("input_layernorm")[l], g("q_norm")[l], g("k_norm")[l], g("q_proj")[l], g("k_proj")[l],
                      g("v_proj")[l], g("o_proj")[l], g("post_attention_layernorm")[l], g("gate")[l],
                      torch.cat([g("w1")[l], g("w3")[l]], dim=1), g("w2")[l]]
        return cat(parts + [g("norm"), g("lm_head")])

    def forward(P, tokens):
        return llama(dict(P, top_k=K, norm_topk=False), tokens, L, NH, NKV, C, THETA, EPS_RMS, "lm_head", HS)

    write("qwen3_moe_tiny.safetensors", P, flat, forward,
          f"name: qwen3_moe\nn_layers: {L}\nn_heads: {NH}\nn_kv_heads: {NKV}\nd_model: {C}\nhead_dim: {HS}\n"
          f"vocab_size: {V}\nmax_seq_len: {MAX_T}\nmoe_intermediate_size: {FF}\nrope_theta: {THETA}\n"
          f"rms_norm_eps: {EPS_RMS}\nnum_experts: {E}\nnum_experts_per_tok: {K}\nnorm_topk_prob: false\n"
          f"tie_word_embeddings: false\n",
          {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "w1", "w3", "w2", "lm_head"}, sensitive=True)


def write_mixtral():
    """A Mixtral: four query heads over two key/value heads, four SwiGLU experts of 24, top 2, an
    untied head."""
    L, NH, NKV, C, FF, E, K, THETA, EPS_RMS = 2, 4, 2, 32, 24, 4, 2, 10000.0, 1e-5
    hs = C // NH
    P = make_params({"embed_tokens": (V, C), "input_layernorm": (L, C), "q_proj": (L, C, C),
                     "k_proj": (L, NKV * hs, C), "v_proj": (L, NKV * hs, C), "o_proj": (L, C, C),
                     "post_attention_layernorm": (L, C), "gate": (L, E, C), "w1": (L, E, FF, C),
                     "w3": (L, E, FF, C), "w2": (L, E, C, FF), "norm": (C,), "lm_head": (V, C)})

    def flat(g):
        parts = [g("embed_tokens")]
        for l in range(L):
            # anvil's fused first product: each expert's gate (w1) rows, then its up (w3) rows.
            parts += [g("input_layernorm")[l], g("q_proj")[l], g("k_proj")[l], g("v_proj")[l], g("o_proj")[l],
                      g("post_attention_layernorm")[l], g("gate")[l], torch.cat([g("w1")[l], g("w3")[l]], dim=1),
                      g("w2")[l]]
        return cat(parts + [g("norm"), g("lm_head")])

    def forward(P, tokens):
        return llama(dict(P, top_k=K), tokens, L, NH, NKV, C, THETA, EPS_RMS, "lm_head")

    write("mixtral_tiny.safetensors", P, flat, forward,
          f"name: mixtral\nn_layers: {L}\nn_heads: {NH}\nn_kv_heads: {NKV}\nd_model: {C}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nintermediate_size: {FF}\nrope_theta: {THETA}\nrms_norm_eps: {EPS_RMS}\n"
          f"num_local_experts: {E}\nnum_experts_per_tok: {K}\ntie_word_embeddings: false\n",
          {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "w1", "w3", "w2", "lm_head"})


def write_mpt_qk_ln():
    """MPT with attn_config.qk_ln: six ALiBi heads over two key/value heads, RMSNorm, no biases;
    then four RoPE heads over one, LayerNorms and products with biases (no_bias: false). (Under
    ALiBi a key bias shifts every score of a query alike: its gradient is zero, and AdamW's steps
    on a zero gradient's rounding noise cannot be compared; RoPE rotates it by position.)"""
    L, C = 2, 24
    for name, NH, KV, rope in [("mpt_qkln_tiny.safetensors", 6, 2, False),
                               ("mpt_qkln_rope_tiny.safetensors", 4, 1, True)]:
        hs = C // NH
        kv = KV * hs
        biases = rope
        shapes = {"wte": (V, C), "norm_1": (L, C), "q_ln": (L, C), "k_ln": (L, kv), "Wqkv": (L, C + 2 * kv, C),
                  "out_proj": (L, C, C), "norm_2": (L, C), "up_proj": (L, 4 * C, C), "down_proj": (L, C, 4 * C),
                  "norm_f": (C,)}
        if biases:
            for n in ["norm_1", "q_ln", "k_ln", "Wqkv", "out_proj", "norm_2", "up_proj", "down_proj"]:
                shapes[n + ".bias"] = shapes[n][:2]  # (L, width) of a norm, (L, outputs) of a product
            shapes["norm_f.bias"] = (C,)
        P = make_params(shapes)
        # anvil's block order: the norms before qkv (norm_1, q_ln, k_ln: each weight, then bias),
        # qkv, out_proj, norm_2, up_proj, down_proj.
        order = ["norm_1", "q_ln", "k_ln", "Wqkv", "out_proj", "norm_2", "up_proj", "down_proj"]
        block = [t for n in order for t in ([n, n + ".bias"] if biases else [n])]
        final = ["norm_f", "norm_f.bias"] if biases else ["norm_f"]
        write(name, P,
              lambda g, block=block, final=final: cat([g("wte")] + [g(n)[l] for l in range(L) for n in block] +
                                                      [g(n) for n in final]),
              lambda P, tokens, NH=NH, KV=KV, rope=rope: mpt(P, tokens, L, NH, C, KV, True, rope, not rope),
              f"name: mpt_causal_lm\nn_layers: {L}\nn_heads: {NH}\nd_model: {C}\nvocab_size: {V}\n"
              f"max_seq_len: {MAX_T}\nexpansion_ratio: 4\nno_bias: {'false' if rope else 'true'}\n"
              f"norm_type: {'low_precision_layernorm' if rope else 'rmsnorm'}\n"
              f"attn_config:\n  qk_ln: true\n  attn_type: grouped_query_attention\n  kv_n_heads: {KV}\n"
              f"  {'rope' if rope else 'alibi'}: true\n",
              {"Wqkv", "out_proj", "up_proj", "down_proj"})


def write_llama(name, NKV, tied, qkv_bias=False, qk_norm=False, hs=None, window=0):
    """qkv_bias: Qwen2 (Qwen2Attention: biases on q, k and v, none on o or the MLP); qk_norm and hs:
    Qwen3 (q_norm and k_norm over each head, a head size other than C // NH); window: Mistral's
    sliding window, shorter than the sequence."""
    L, NH, C, FF, THETA, EPS_RMS = 2, 4, 32, 40, 10000.0, 1e-5
    hs = hs or C // NH
    shapes = {"embed_tokens": (V, C), "input_layernorm": (L, C), "q_proj": (L, NH * hs, C),
              "k_proj": (L, NKV * hs, C), "v_proj": (L, NKV * hs, C), "o_proj": (L, C, NH * hs),
              "post_attention_layernorm": (L, C), "gate_proj": (L, FF, C), "up_proj": (L, FF, C),
              "down_proj": (L, C, FF), "norm": (C,)}
    if not tied:
        shapes["lm_head"] = (V, C)
    if qkv_bias:
        shapes.update({"q_bias": (L, NH * hs), "k_bias": (L, NKV * hs), "v_bias": (L, NKV * hs)})
    if qk_norm:
        shapes.update({"q_norm": (L, hs), "k_norm": (L, hs)})
    P = make_params(shapes)
    head = "embed_tokens" if tied else "lm_head"

    def llama_flat(g):
        parts = [g("embed_tokens")]
        for l in range(L):
            parts += [g("input_layernorm")[l]]
            parts += [g("q_norm")[l], g("k_norm")[l]] if qk_norm else []
            parts += [g("q_proj")[l], g("k_proj")[l], g("v_proj")[l]]
            parts += [g("q_bias")[l], g("k_bias")[l], g("v_bias")[l]] if qkv_bias else []
            parts += [g("o_proj")[l], g("post_attention_layernorm")[l], g("gate_proj")[l], g("up_proj")[l],
                      g("down_proj")[l]]
        return cat(parts + [g("norm")] + ([] if tied else [g("lm_head")]))

    write(name, P, llama_flat,
          lambda P, tokens: llama(P, tokens, L, NH, NKV, C, THETA, EPS_RMS, head, hs, window),
          f"name: {'mistral' if window else 'qwen3' if qk_norm else 'qwen2' if qkv_bias else 'llama'}\n"
          f"n_layers: {L}\nn_heads: {NH}\n" + (f"sliding_window: {window}\n" if window else "") +
          f"n_kv_heads: {NKV}\nd_model: {C}\nhead_dim: {hs}\nvocab_size: {V}\n"
          f"max_seq_len: {MAX_T}\nintermediate_size: {FF}\nrope_theta: {THETA}\nrms_norm_eps: {EPS_RMS}\n"
          f"tie_word_embeddings: {'true' if tied else 'false'}\n",
          {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"})


if __name__ == "__main__":
    if sys.argv[1:] == ["qwen3_moe"]:
        torch.manual_seed(20261130)
        write_qwen3_moe()
    else:
        main()
