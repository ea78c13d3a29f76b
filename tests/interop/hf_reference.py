#!/usr/bin/python3
"""An independent reader of a Hugging Face transformers model directory, for anvil's export tests.

usage: hf_reference.py loss HF_DIR MDS_SPLIT_DIR N [--adapter PEFT_DIR]
                                                      the mean loss per target token on the split's
                                                      first N samples (inputs tokens[0, T), targets
                                                      tokens[1, T+1), T the model's context length;
                                                      the last target dropped when a sample is T long;
                                                      fine-tuning turns as Foundry's collator makes
                                                      them, the loss on the last response); with a
                                                      PEFT LoRA adapter directory on top of the model
       hf_reference.py greedy HF_DIR N TOKEN_ID...   prints the N greedy next-token ids, one line
       hf_reference.py rounded FP32_DIR OTHER_DIR     checks OTHER_DIR's 16-bit tensors are FP32_DIR's,
                                                      rounded to nearest even
       hf_reference.py index HF_DIR                   checks a sharded directory's index against its files
       hf_reference.py write ARCH OUT_DIR [--dtype bf16] [--shards N] [--gpt2-original-names]
                                                      writes a small random model of ARCH (gpt2, llama,
                                                      llama-tied, llama31 (rope_scaling llama3),
                                                      mistral, mixtral, qwen2, qwen3, qwen3_moe, mpt) as transformers'
                                                      save_pretrained lays it out;
                                                      --gpt2-original-names as OpenAI's converted
                                                      files name GPT-2's tensors (no "transformer."
                                                      prefix, attn.bias mask buffers)

Nothing here comes from anvil: the safetensors files are parsed from the format's definition (an
8-byte little-endian header length, a JSON header, raw data), and the model is rebuilt from
config.json and transformers' tensor names following transformers' modeling files:
GPT2LMHeadModel (Conv1D weights stored input x output, learned positions, tanh GELU "gelu_new"),
LlamaForCausalLM (RMSNorm in fp32, rotate-half RoPE with rope_scaling's frequencies, repeat_kv
for grouped heads, SwiGLU, lm_head unless tied), MistralForCausalLM (Llama's, attention within
sliding_window keys), MixtralForCausalLM (Mistral's with each MLP a sparse block of experts:
softmax over the gate, the top num_experts_per_tok renormalised), Qwen2ForCausalLM (Llama's with
biases on q, k and v), Qwen3ForCausalLM
(Llama's with head_dim and an RMSNorm over each head's queries and keys before RoPE) and
MptForCausalLM (ALiBi from gen_slopes, LayerNorm without bias, exact GELU, tied).
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# The writer of the golden fixtures (tests/golden): test code, like this reader, not anvil's.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
from make_gpt2_fixture import write_safetensors  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    assert meta is not None and meta.get("format") == "pt", f"{path}: metadata format must be 'pt' for transformers"
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=DTYPES[h["dtype"]])
        out[name] = t.reshape(h["shape"])
    return out


def load_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for file in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(d, file)))
    assert set(tensors) == set(weight_map), "the index and the shard files name different tensors"
    return tensors


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def causal(scores, window=None):
    """Softmax over the keys a query sees: itself and those before it, and with a sliding window
    (MistralForCausalLM's sliding_window) only the last `window` of them."""
    T = scores.shape[-1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if window is not None:
        mask &= torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1 - window)
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def gpt2(cfg, W, ids):
    T, C, NH = len(ids), cfg["n_embd"], cfg["n_head"]
    hs, eps = C // NH, cfg.get("layer_norm_epsilon", 1e-5)  # GPT2Config's defaults
    act = gelu_new if cfg.get("activation_function", "gelu_new") == "gelu_new" else F.gelu
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (t.view(T, NH, hs).transpose(0, 1) for t in qkv.split(C, dim=-1))
        y = (causal(q @ k.transpose(-2, -1) / math.sqrt(hs)) @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        x = x + act(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"]) @ W[p + "mlp.c_proj.weight"] \
            + W[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    return x @ W.get("lm_head.weight", W["transformer.wte.weight"]).T


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_inv_freq(cfg, hs):
    """transformers' ROPE_INIT_FUNCTIONS for rope_type default, linear and llama3 (rope_scaling, or
    transformers 5's rope_parameters with rope_theta inside)."""
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = scaling.get("rope_theta", cfg.get("rope_theta"))
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":  # _compute_llama3_parameters
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    assert kind == "default", f"rope_type {kind}"
    return inv_freq


def llama(cfg, W, ids):
    T, C, NH, NKV = len(ids), cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hs, eps = cfg.get("head_dim", C // NH), cfg["rms_norm_eps"]
    inv_freq = rope_inv_freq(cfg, hs)
    emb = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq).repeat(1, 2)
    cos, sin = emb.cos(), emb.sin()
    # LlamaAttention: attention_bias on q, k, v and o; Qwen2Attention: always on q, k, v, never o.
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    o_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."

        def lin(name, h, bias):
            y = h @ W[p + name + ".weight"].T
            return y + W[p + name + ".bias"] if bias else y

        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin("self_attn.q_proj", h, qkv_bias).view(T, NH, hs)
        k = lin("self_attn.k_proj", h, qkv_bias).view(T, NKV, hs)
        v = lin("self_attn.v_proj", h, qkv_bias).view(T, NKV, hs).transpose(0, 1)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):  # q_norm and k_norm over each head, before RoPE
            q, k = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps), rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // NKV, dim=0), v.repeat_interleave(NH // NKV, dim=0)
        y = (causal(q @ k.transpose(-2, -1) / math.sqrt(hs), cfg.get("sliding_window")) @ v) \
            .transpose(0, 1).reshape(T, NH * hs)
        x = x + lin("self_attn.o_proj", y, o_bias)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "mixtral":
            x = x + sparse_block(W, p + "block_sparse_moe.", h, cfg["num_local_experts"], cfg["num_experts_per_tok"],
                                 True, ("w1", "w3", "w2"))
            continue
        if cfg["model_type"] == "qwen3_moe":
            x = x + sparse_block(W, p + "mlp.", h, cfg["num_experts"], cfg["num_experts_per_tok"],
                                 cfg["norm_topk_prob"], ("gate_proj", "up_proj", "down_proj"))
            continue
        x = x + lin("mlp.down_proj", F.silu(lin("mlp.gate_proj", h, mlp_bias)) * lin("mlp.up_proj", h, mlp_bias),
                    mlp_bias)
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.T


def sparse_block(W, p, h, experts, top_k, renormalise, names):
    """MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock: softmax over the gate's logits, each
    token's top_k most probable experts, their probabilities as weights (renormalised to sum to 1
    for Mixtral, and for Qwen3-MoE under norm_topk_prob), each expert down(silu(gate h) * up h);
    names: the experts' gate, up and down products."""
    probs = F.softmax(h @ W[p + "gate.weight"].T, dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    gate, up, down = names
    out = torch.zeros_like(h)
    for e in range(experts):
        x = f"{p}experts.{e}."
        token, slot = torch.where(chosen == e)
        if len(token) == 0:
            continue
        y = (F.silu(h[token] @ W[x + gate + ".weight"].T) * (h[token] @ W[x + up + ".weight"].T)) @ \
            W[x + down + ".weight"].T
        out.index_add_(0, token, y * weights[token, slot, None])
    return out


def gen_slopes(n_heads, bias_max):
    n = 2 ** math.ceil(math.log2(n_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n + 1, dtype=torch.float32) * (bias_max / n))
    return torch.cat([slopes[1::2], slopes[::2]])[:n_heads] if n != n_heads else slopes


def mpt(cfg, W, ids):
    T, C, NH = len(ids), cfg["d_model"], cfg["n_heads"]
    hs, eps = C // NH, cfg.get("layer_norm_epsilon", 1e-5)  # MptConfig's defaults
    alibi = gen_slopes(NH, cfg.get("attn_config", {}).get("alibi_bias_max", 8)).view(NH, 1, 1) \
        * torch.arange(1 - T, 1, dtype=torch.float32).view(1, 1, T)
    x = W["transformer.wte.weight"][ids]
    for l in range(cfg["n_layers"]):
        p = f"transformer.blocks.{l}."
        h = F.layer_norm(x, (C,), W[p + "norm_1.weight"], None, eps)
        q, k, v = (t.view(T, NH, hs).transpose(0, 1) for t in (h @ W[p + "attn.Wqkv.weight"].T).chunk(3, dim=-1))
        y = (causal(q @ k.transpose(-2, -1) / math.sqrt(hs) + alibi) @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ W[p + "attn.out_proj.weight"].T
        h = F.layer_norm(x, (C,), W[p + "norm_2.weight"], None, eps)
        x = x + F.gelu(h @ W[p + "ffn.up_proj.weight"].T) @ W[p + "ffn.down_proj.weight"].T
    x = F.layer_norm(x, (C,), W["transformer.norm_f.weight"], None, eps)
    return x @ W["transformer.wte.weight"].T


def load_model(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    forward = {"gpt2": gpt2, "llama": llama, "mistral": llama, "mixtral": llama, "qwen2": llama, "qwen3": llama,
               "qwen3_moe": llama,
               "mpt": mpt}[cfg["model_type"]]
    W = {k: v.float() for k, v in load_dir(d).items()}
    if cfg["model_type"] == "gpt2":  # OpenAI's converted files: no "transformer." prefix, mask buffers
        W = {k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v for k, v in W.items()
             if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    return cfg, forward, W


def apply_peft_lora(W, adapter_dir):
    """A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) on top of the
    weights, as PEFT's LoraLayer computes it (merged: W + scaling * B @ A, transposed for Conv1D's
    input x output storage when fan_in_fan_out), scaling lora_alpha / r (lora_alpha / sqrt(r) with
    use_rslora). Every adapted module must be one target_modules names (PEFT's suffix match), with
    a lora_A and a lora_B, and exist in the model."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    assert acfg["peft_type"] == "LORA" and acfg["task_type"] == "CAUSAL_LM", acfg
    r = acfg["r"]
    scaling = acfg["lora_alpha"] / (math.sqrt(r) if acfg.get("use_rslora", False) else r)
    targets = acfg["target_modules"]
    A = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    prefix = "base_model.model."
    modules = sorted({k[len(prefix):].rsplit(".lora_", 1)[0] for k in A})
    assert all(k.startswith(prefix) and (k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight")) for k in A)
    for m in modules:
        assert any(m == t or m.endswith("." + t) for t in targets), f"{m} is not among target_modules {targets}"
        a, b = A[prefix + m + ".lora_A.weight"].double(), A[prefix + m + ".lora_B.weight"].double()
        assert a.shape[0] == r and b.shape[1] == r, f"{m}: lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)}, r {r}"
        delta = scaling * (b @ a)
        w = W[m + ".weight"]
        if acfg.get("fan_in_fan_out", False):
            delta = delta.T
        assert w.shape == delta.shape, f"{m}: weight {tuple(w.shape)}, adapter delta {tuple(delta.shape)}"
        W[m + ".weight"] = (w.double() + delta).float()
    return len(modules)


def finetuning_example(turns, split_dir):
    """LLM Foundry's decoder-only collator with target_prompts none, target_responses last: the
    turns back to back, EOS appended to the last response unless it ends with one, labels -100
    except on the last response."""
    with open(os.path.join(split_dir, "tokenizer_record.json")) as f:
        eos = json.load(f)["eos_id"]
    ids, labels = [], []
    for k, turn in enumerate(turns):
        last = k + 1 == len(turns)
        response = list(turn["labels"])
        if last and response[-1:] != [eos]:
            response.append(eos)
        ids += list(turn["input_ids"]) + response
        labels += [-100] * len(turn["input_ids"]) + (response if last else [-100] * len(response))
    return ids, labels


def loss(d, split_dir, n, adapter=None):
    cfg, forward, W = load_model(d)
    if adapter:
        apply_peft_lora(W, adapter)
    T = cfg.get("n_positions") or cfg.get("max_position_embeddings") or cfg["max_seq_len"]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    from mds_reference import read_samples
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in read_samples(split_dir)[1][:n]:
            if isinstance(sample, dict):  # fine-tuning turns: loss on the last response only
                ids, labels = finetuning_example(sample["turns"], split_dir)
                inputs = torch.tensor(ids[:T], dtype=torch.long)
                # transformers' causal LM loss: position i predicts labels[i + 1]; -100 carries none.
                targets = torch.tensor(labels[1:T], dtype=torch.long)
                logits = forward(cfg, W, inputs)[:len(targets)]
                total += float(F.cross_entropy(logits.double(), targets, ignore_index=-100, reduction="sum"))
                count += int((targets != -100).sum())
                continue
            tokens = torch.tensor(sample, dtype=torch.long)
            inputs, targets = tokens[:T], tokens[1:T + 1]
            logits = forward(cfg, W, inputs)[:len(targets)]
            total += float(F.cross_entropy(logits.double(), targets, reduction="sum"))
            count += len(targets)
    print(json.dumps({"loss": total / count, "target_tokens": count}))


def greedy(d, n, ids):
    cfg, forward, W = load_model(d)
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(forward(cfg, W, torch.tensor(ids))[-1].argmax())
            ids.append(nxt)
            out.append(nxt)
    print(" ".join(map(str, out)))


def rounded(fp32_dir, other_dir):
    a, b = load_dir(fp32_dir), load_dir(other_dir)
    assert set(a) == set(b), "the two exports name different tensors"
    for name in a:
        want = a[name].to(b[name].dtype)
        assert torch.equal(want.view(torch.int16), b[name].view(torch.int16)), f"{name} is not rounded to nearest even"
    print(f"{len(a)} tensors, each the fp32 export rounded to {next(iter(b.values())).dtype}")


def write(arch, out, dtype, shards, original_names):
    """A small random model: 2 layers, 4 heads, width 64, the GPT-2 vocabulary, context 64."""
    torch.manual_seed(7)
    L, C, NH, V, T = 2, 64, 4, 50257, 64
    W = {}

    def rnd(*shape, scale=0.05):
        return torch.randn(*shape) * scale

    if arch == "gpt2":
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": T,
               "n_embd": C, "n_layer": L, "n_head": NH, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
        W["transformer.wte.weight"], W["transformer.wpe.weight"] = rnd(V, C), rnd(T, C)
        for l in range(L):
            p = f"transformer.h.{l}."
            for ln in ("ln_1", "ln_2"):
                W[p + ln + ".weight"], W[p + ln + ".bias"] = 1 + rnd(C), rnd(C)
            W[p + "attn.c_attn.weight"], W[p + "attn.c_attn.bias"] = rnd(C, 3 * C), rnd(3 * C)
            W[p + "attn.c_proj.weight"], W[p + "attn.c_proj.bias"] = rnd(C, C), rnd(C)
            W[p + "mlp.c_fc.weight"], W[p + "mlp.c_fc.bias"] = rnd(C, 4 * C), rnd(4 * C)
            W[p + "mlp.c_proj.weight"], W[p + "mlp.c_proj.bias"] = rnd(4 * C, C), rnd(C)
        W["transformer.ln_f.weight"], W["transformer.ln_f.bias"] = 1 + rnd(C), rnd(C)
        if original_names:
            W = {k[len("transformer."):]: v for k, v in W.items()}
            for l in range(L):
                W[f"h.{l}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    elif arch in ("llama", "llama-tied", "llama31", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe"):
        NKV, F = 2, 96
        tied = arch in ("llama-tied", "qwen2")
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
               "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH,
               "num_key_value_heads": NKV, "hidden_act": "silu", "max_position_embeddings": T,
               "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "rope_scaling": None, "attention_bias": False,
               "tie_word_embeddings": tied}
        if arch == "llama31":  # Llama 3.1's rope_scaling over a short original context: every regime at T
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        if arch == "mistral":  # MistralConfig: no bias switches; a window as long as the context
            cfg = {k: v for k, v in cfg.items() if k != "attention_bias"}
            cfg.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "rope_theta": 1000000.0,
                        "sliding_window": T})
        if arch == "qwen2":  # Qwen2Config, as Qwen2.5-0.5B's: no bias switches, a window that is not used
            cfg = {k: v for k, v in cfg.items() if k != "attention_bias"}
            cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1000000.0,
                        "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21})
        if arch == "mixtral":  # MixtralConfig, as Mixtral-8x7B-v0.1's but smaller: 4 experts, top 2
            cfg = {k: v for k, v in cfg.items() if k != "attention_bias"}
            cfg.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "rope_theta": 1000000.0,
                        "sliding_window": None, "num_local_experts": 4, "num_experts_per_tok": 2,
                        "output_router_logits": False, "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0})
        hs = C // NH
        if arch == "qwen3":  # Qwen3Config, as Qwen3-0.6B's: heads wider than hidden_size / heads
            hs = 32
            cfg.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_theta": 1000000.0,
                        "head_dim": hs, "sliding_window": None, "use_sliding_window": False,
                        "max_window_layers": 28, "tie_word_embeddings": True})
        if arch == "qwen3_moe":  # Qwen3MoeConfig, as Qwen3-30B-A3B's but smaller: 4 experts of 48, top 2
            hs = 32
            cfg.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "rope_theta": 1000000.0,
                        "head_dim": hs, "sliding_window": None, "use_sliding_window": False, "max_window_layers": L,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": F // 2,
                        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False,
                        "output_router_logits": False, "router_aux_loss_coef": 0.001})
        W["model.embed_tokens.weight"] = rnd(V, C)
        for l in range(L):
            p = f"model.layers.{l}."
            W[p + "input_layernorm.weight"], W[p + "post_attention_layernorm.weight"] = 1 + rnd(C), 1 + rnd(C)
            W[p + "self_attn.q_proj.weight"], W[p + "self_attn.o_proj.weight"] = rnd(NH * hs, C), rnd(C, NH * hs)
            W[p + "self_attn.k_proj.weight"], W[p + "self_attn.v_proj.weight"] = rnd(NKV * hs, C), rnd(NKV * hs, C)
            if arch == "llama31":  # sharper attention, so that the positions' frequencies show in the loss
                for n in ("q_proj", "k_proj"):
                    W[p + f"self_attn.{n}.weight"] *= 4
            if arch in ("qwen3", "qwen3_moe"):
                W[p + "self_attn.q_norm.weight"], W[p + "self_attn.k_norm.weight"] = 1 + rnd(hs), 1 + rnd(hs)
            if arch == "qwen2":
                W[p + "self_attn.q_proj.bias"] = rnd(C, scale=0.5)
                W[p + "self_attn.k_proj.bias"], W[p + "self_attn.v_proj.bias"] = rnd(NKV * hs, scale=0.5), rnd(NKV * hs, scale=0.5)
            if arch == "mixtral":
                W[p + "block_sparse_moe.gate.weight"] = rnd(4, C, scale=0.5)  # choices that differ by token
                for e in range(4):
                    x = f"{p}block_sparse_moe.experts.{e}."
                    W[x + "w1.weight"], W[x + "w2.weight"], W[x + "w3.weight"] = rnd(F, C), rnd(C, F), rnd(F, C)
                continue
            if arch == "qwen3_moe":
                W[p + "mlp.gate.weight"] = rnd(4, C, scale=0.5)  # choices that differ by token
                for e in range(4):
                    x = f"{p}mlp.experts.{e}."
                    W[x + "gate_proj.weight"], W[x + "up_proj.weight"] = rnd(F // 2, C), rnd(F // 2, C)
                    W[x + "down_proj.weight"] = rnd(C, F // 2)
                continue
            W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"] = rnd(F, C), rnd(F, C)
            W[p + "mlp.down_proj.weight"] = rnd(C, F)
        W["model.norm.weight"] = 1 + rnd(C)
        if not cfg["tie_word_embeddings"]:
            W["lm_head.weight"] = rnd(V, C)
    elif arch == "mpt":
        cfg = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "vocab_size": V, "d_model": C,
               "n_heads": NH, "n_layers": L, "expansion_ratio": 4, "max_seq_len": T,
               "no_bias": True, "learned_pos_emb": False, "attn_config": {"alibi": True, "alibi_bias_max": 8}}
        W["transformer.wte.weight"] = rnd(V, C)
        for l in range(L):
            p = f"transformer.blocks.{l}."
            W[p + "norm_1.weight"], W[p + "norm_2.weight"] = 1 + rnd(C), 1 + rnd(C)
            W[p + "attn.Wqkv.weight"], W[p + "attn.out_proj.weight"] = rnd(3 * C, C), rnd(C, C)
            W[p + "ffn.up_proj.weight"], W[p + "ffn.down_proj.weight"] = rnd(4 * C, C), rnd(C, 4 * C)
        W["transformer.norm_f.weight"] = 1 + rnd(C)
    else:
        sys.exit(f"unknown architecture {arch}")
    cast = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    W = {k: v.to(cast) for k, v in W.items()}
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(W)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), W, {"format": "pt"})
    else:
        per = (len(names) + shards - 1) // shards
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: W[k] for k in names[i * per:(i + 1) * per]}
            write_safetensors(os.path.join(out, file), part, {"format": "pt"})
            weight_map.update({k: file for k in part})
        total = sum(t.numel() * t.element_size() for t in W.values())
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"wrote {out}: {arch}, {len(W)} tensors, {dtype}, {shards} file(s)")


def index(d):
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    files = sorted(set(idx["weight_map"].values()))
    n = len(files)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], files
    total = sum(t.numel() * t.element_size() for t in load_dir(d).values())
    assert idx["metadata"]["total_size"] == total, (idx["metadata"]["total_size"], total)
    print(f"{n} shards, {len(idx['weight_map'])} tensors, total_size {total}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "loss":
        loss(sys.argv[2], sys.argv[3], int(sys.argv[4]),
             sys.argv[6] if len(sys.argv) > 6 and sys.argv[5] == "--adapter" else None)
    elif cmd == "greedy":
        greedy(sys.argv[2], int(sys.argv[3]), [int(t) for t in sys.argv[4:]])
    elif cmd == "rounded":
        rounded(sys.argv[2], sys.argv[3])
    elif cmd == "index":
        index(sys.argv[2])
    elif cmd == "write":
        args = sys.argv[4:]
        dtype = args[args.index("--dtype") + 1] if "--dtype" in args else "fp32"
        shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 1
        write(sys.argv[2], sys.argv[3], dtype, shards, "--gpt2-original-names" in args)
    else:
        sys.exit(__doc__)
