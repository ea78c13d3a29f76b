#!/usr/bin/env bash
# Training on the GPU as a user runs it, against the CPU (skips, saying why, without a GPU):
# - kernels=gpu twice: every step's loss and the final weights bit for bit;
# - kernels=gpu against kernels=cpu from the same seed (deterministic_mode: false on both): every
#   step's loss within 1e-5 relative over 15 steps (fp32 sums in another order; differences that
#   small stay small this early, docs/PORTABILITY.md shows where they grow);
# - CPU to step 8, then GPU to 15 from its checkpoint (autoresume), and GPU then CPU: the losses of
#   the CPU-only run within 1e-5;
# - amp_bf16 on the GPU against amp_bf16 on the CPU: within 1e-2 (16-bit roundings can flip with the
#   sum order);
# - an MPT (ALiBi, no biases), a multi-query Llama, a Qwen3 (its own head size, per-head q/k
#   norms) and an MPT whose MLPs are mixtures of experts (mb_moe, top 2 of 4, experts filling) on
#   the GPU against the CPU: within 1e-5; the mixture of experts under deterministic_mode with
#   microbatch 4 and 1: the same bits;
# - device_train_microbatch_size: auto fits the GPU's memory (the whole batch of 8 here) and
#   follows the same curve;
# - deterministic_mode on the GPU (fixed-point gradient sums on the device): microbatch 4, 1 and 3
#   give the same weights bit for bit; 2 MPI ranks sharing the GPU (host-staged collectives), under
#   ZeRO stages 0 to 3, give those same bits too, and so does one rank through NCCL (in builds
#   with NCCL/RCCL; the emulated GPU has none); and the run follows the deterministic CPU run;
# - LoRA (every product adapted, lora_dropout 0.1) on the deterministic run's weights: the GPU
#   follows the CPU within 1e-5, microbatch 4 and 1 and 2 ranks under ZeRO-3 give the same bits,
#   and amp_bf16 (the base held in bf16) follows the CPU's within 1e-2;
# - LLM Foundry's ICL tasks during training: the GPU's accuracies are the CPU's.
# The model is GPT-2 with a 1024-token cut of its vocabulary (tests/lib.sh, small_gpt2_vocab).
# Usage: test_gpu_training.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
doctor_report=$("$anvil" doctor 2>/dev/null)
if grep -q "^gpus: none visible" <<< "$doctor_report"; then
  echo "skipped: no GPU visible ($(grep '^gpu backend' <<< "$doctor_report"))"
  exit 0
fi
start_test

small_gpt2_vocab "$src" "$tmp/vocab" && prepare_brown_news "$anvil" "$src" "$tmp" 32 "$tmp/vocab" \
  || { echo "FAIL: data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml at width 64, 15 steps, a checkpoint at step 8.
g=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" model.d_model=64 train_loader.num_workers=1
   optimizer.lr=1.0e-3 scheduler.t_max=15ba max_duration=15ba eval_interval=5ba save_interval=8ba
   deterministic_mode=false seed=5)
# run NAME [RANKS] OVERRIDES...: RANKS (a number) defaults to 1.
run() {
  local name="$1" np=1; shift
  [[ "${1:-}" =~ ^[0-9]+$ ]] && { np="$1"; shift; }
  train_run tiny-gpt2 "$name" "$np" "${g[@]}" "$@" || { fail "$name: training failed"; tail -5 "$tmp/$name.out"; }
}
# compare A B TOL [STEPS]: every step's loss of run B within TOL (relative) of run A's, both runs
# STEPS long (default 15).
compare() {
  python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" "${4:-15}" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b, tol, steps = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
worst = max(abs(b[k] - a[k]) / abs(a[k]) for k in a)
print(f"{len(a)} steps, largest relative difference {worst:.2e} (limit {tol:g})")
sys.exit(0 if len(a) == len(b) == steps and worst <= tol else 1)
PY
}
digest() { "$anvil" inspect "$tmp/$1" 2>/dev/null | sed -n 's/^weights sha256: *//p'; }

run gpu kernels=gpu
run gpu_again kernels=gpu
run cpu kernels=cpu
if python3 - "$tmp/gpu/metrics.jsonl" "$tmp/gpu_again/metrics.jsonl" <<'PY' && [ -n "$(digest gpu)" ] && [ "$(digest gpu)" = "$(digest gpu_again)" ]
import json, sys
keys = ("step", "loss", "grad_norm", "lr", "eval_loss")
rows = [[{k: r[k] for k in keys if k in r} for r in map(json.loads, open(p)) if "step" in r] for p in sys.argv[1:]]
sys.exit(0 if rows[0] == rows[1] and len(rows[0]) > 15 else 1)
PY
then
  pass "kernels=gpu twice: the same losses, gradient norms, evals and weights, bit for bit"
else
  fail "kernels=gpu twice differs"
fi
compare cpu gpu 1e-5 && pass "kernels=gpu follows kernels=cpu" || fail "kernels=gpu against kernels=cpu"

run cpu_then_gpu kernels=cpu max_duration=8ba
run cpu_then_gpu kernels=gpu autoresume=true
compare cpu cpu_then_gpu 1e-5 && pass "CPU to step 8, then GPU from its checkpoint" || fail "CPU then GPU"
run gpu_then_cpu kernels=gpu max_duration=8ba
run gpu_then_cpu kernels=cpu autoresume=true
compare cpu gpu_then_cpu 1e-5 && pass "GPU to step 8, then CPU from its checkpoint" || fail "GPU then CPU"

run cpu_bf16 kernels=cpu precision=amp_bf16
run gpu_bf16 kernels=gpu precision=amp_bf16
compare cpu_bf16 gpu_bf16 1e-2 && pass "amp_bf16: the GPU follows the CPU" || fail "amp_bf16 GPU against CPU"

# The other families: an MPT (ALiBi, no biases, exact GELU, QK LayerNorm), a Llama with one
# key/value head (RoPE, SwiGLU, RMSNorm, its own LM head), a Qwen3 (heads of 16 over a width of
# 64: queries 32 wide; an RMSNorm over each head's queries and keys) and a mixture of experts, each
# on the GPU against the CPU.
moe=(model.name=mpt_causal_lm model.no_bias=true model.attn_config.alibi=true model.ffn_config.ffn_type=mb_moe
     model.ffn_config.moe_num_experts=4 model.ffn_config.moe_top_k=2 model.ffn_config.moe_capacity_factor=1.0)
for family in mpt llama qwen3 moe; do
  case $family in
    mpt) options=(model.name=mpt_causal_lm model.no_bias=true model.attn_config.alibi=true
                  model.attn_config.qk_ln=true) ;;
    moe) options=("${moe[@]}") ;;
    llama) options=(model.name=llama model.n_kv_heads=1) ;;
    qwen3) options=(model.name=qwen3 model.head_dim=16) ;;
  esac
  run "${family}_cpu" kernels=cpu "${options[@]}"
  run "${family}_gpu" kernels=gpu "${options[@]}"
  compare "${family}_cpu" "${family}_gpu" 1e-5 && pass "$family: kernels=gpu follows kernels=cpu" \
    || fail "$family: kernels=gpu against kernels=cpu"
done
# The mixture of experts under deterministic_mode on the GPU: microbatch 4 and 1, the same bits.
run moe_det_mb4 kernels=gpu deterministic_mode=true device_train_microbatch_size=4 "${moe[@]}"
run moe_det_mb1 kernels=gpu deterministic_mode=true device_train_microbatch_size=1 "${moe[@]}"
[ -n "$(digest moe_det_mb4)" ] && [ "$(digest moe_det_mb4)" = "$(digest moe_det_mb1)" ] \
  && pass "moe: deterministic_mode on the GPU, microbatch 4 and 1 give the same weights" \
  || fail "moe: deterministic_mode on the GPU differs between microbatch 4 and 1"

# LLM Foundry's ICL tasks during training (tests/eval/make_icl_tasks.py's, a few questions of each
# type): the GPU scores them as the CPU does, through the passes after a question's kept prefix.
/usr/bin/python3 "$src/tests/eval/make_icl_tasks.py" "$tmp/brown" "$tmp/icl" > /dev/null
# Eight questions of each, their answers cut to four words and the generation task's contexts to
# six: room in 32 tokens.
/usr/bin/python3 - "$tmp/icl" <<'PY'
import json, sys
cut = lambda a: " ".join(a.split()[:4])
for t in ("mc", "schema", "lm", "gen"):
    qs = [json.loads(l) for l in open(f"{sys.argv[1]}/{t}.jsonl")][:8]
    for q in qs:
        if "choices" in q: q["choices"] = [cut(c) for c in q["choices"]]
        if "continuation" in q: q["continuation"] = cut(q["continuation"])
        if "answer" in q: q["context"] = " ".join(q["context"].split()[-6:])  # generation: room for 8 tokens
    open(f"{sys.argv[1]}/few_{t}.jsonl", "w").writelines(json.dumps(q) + "\n" for q in qs)
PY
cat > "$tmp/icl/tasks.yaml" <<YAML
icl_tasks:
- {label: mc, dataset_uri: $tmp/icl/few_mc.jsonl, num_fewshot: [0, 2], icl_task_type: multiple_choice}
- {label: schema, dataset_uri: $tmp/icl/few_schema.jsonl, num_fewshot: [1], icl_task_type: schema}
- {label: lm, dataset_uri: $tmp/icl/few_lm.jsonl, num_fewshot: [0], icl_task_type: language_modeling}
- {label: gen, dataset_uri: $tmp/icl/few_gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers,
   early_stopping_criteria: ["\\n\\n", "[.!?]"], generation_kwargs: {max_new_tokens: 8}}
YAML
icl=(max_duration=3ba eval_interval=3ba eval_subset_num_batches=1 icl_tasks="$tmp/icl/tasks.yaml")
run icl_cpu kernels=cpu "${icl[@]}"
run icl_gpu kernels=gpu "${icl[@]}"
scores() { grep -o '"metrics/[^,}]*' "$tmp/$1/metrics.jsonl" | sort; }
# (Some task scores strictly between 0 and 1, so that its questions' outcomes are told apart.)
if [ "$(scores icl_cpu | wc -l)" -ge 5 ] && [ "$(scores icl_cpu)" = "$(scores icl_gpu)" ] \
   && scores icl_gpu | grep -q ':0\.[0-9]*[1-9]'; then
  pass "ICL tasks during training: the GPU's accuracies are the CPU's: $(scores icl_gpu | tr '\n' ' ')"
else
  fail "ICL tasks: the CPU's '$(scores icl_cpu | tr '\n' ' ')', the GPU's '$(scores icl_gpu | tr '\n' ' ')'"
fi

run gpu_auto kernels=gpu device_train_microbatch_size=auto
if grep -q '"microbatch":8' "$tmp/gpu_auto/metrics.jsonl" && compare gpu gpu_auto 1e-5; then
  pass "auto microbatch on the GPU: the whole batch fits, the same curve"
else
  fail "auto microbatch on the GPU: $(head -1 "$tmp/gpu_auto/metrics.jsonl")"
fi

# Bit-for-bit comparisons need no long runs: 6 steps each.
det=(deterministic_mode=true max_duration=6ba)
run gpu_det kernels=gpu "${det[@]}"
run cpu_det kernels=cpu "${det[@]}"
compare cpu_det gpu_det 1e-5 6 && pass "deterministic_mode: the GPU follows the CPU" || fail "deterministic GPU against CPU"
ok=1
for mb in 1 3; do
  run "gpu_det_mb$mb" kernels=gpu "${det[@]}" device_train_microbatch_size=$mb
  [ -n "$(digest gpu_det)" ] && [ "$(digest gpu_det)" = "$(digest gpu_det_mb$mb)" ] || { ok=0; echo "microbatch $mb differs"; }
done
[ $ok = 1 ] && pass "deterministic_mode on the GPU: microbatch 4, 1 and 3, the same weights bit for bit" \
  || fail "deterministic_mode on the GPU across microbatch sizes"
if have_mpirun; then
  ok=1
  for stage in 0 1 2 3; do
    name="gpu_det_w2_z$stage"
    train_run tiny-gpt2 "$name" 2 "${g[@]}" kernels=gpu "${det[@]}" distributed.zero_stage=$stage \
      || { ok=0; tail -5 "$tmp/$name.out"; }
    [ "$(digest gpu_det)" = "$(digest $name)" ] || { ok=0; echo "2 ranks, ZeRO-$stage differs"; }
  done
  [ $ok = 1 ] && pass "deterministic_mode on the GPU: 2 ranks under ZeRO 0-3 give the 1-rank weights bit for bit" \
    || fail "deterministic_mode on the GPU across world sizes"
else
  skip "deterministic_mode on the GPU across world sizes (no mpirun)"
fi
# LoRA on the GPU, its base the deterministic run's weights.
lora=("${det[@]}" load_path="$tmp/cpu_det"
      "model.peft_config={peft_type: LORA, r: 4, lora_alpha: 8, lora_dropout: 0.1, target_modules: all-linear}")
run lora_cpu kernels=cpu "${lora[@]}"
run lora_gpu kernels=gpu "${lora[@]}"
run lora_gpu_mb1 kernels=gpu "${lora[@]}" device_train_microbatch_size=1
same=(lora_gpu_mb1); have_mpirun && { run lora_gpu_w2 2 kernels=gpu "${lora[@]}" distributed.zero_stage=3; same+=(lora_gpu_w2); }
ok=1
for name in "${same[@]}"; do [ -n "$(digest lora_gpu)" ] && [ "$(digest lora_gpu)" = "$(digest $name)" ] || ok=0; done
if compare lora_cpu lora_gpu 1e-5 6 && [ $ok = 1 ]; then
  pass "LoRA on the GPU follows the CPU; microbatch 4 and ${same[*]#lora_gpu_} give the same adapters bit for bit"
else
  fail "LoRA on the GPU: $(digest lora_gpu), ${same[*]}: $(for n in "${same[@]}"; do digest $n; done)"
fi
run lora_cpu_bf16 kernels=cpu "${lora[@]}" precision=amp_bf16
run lora_gpu_bf16 kernels=gpu "${lora[@]}" precision=amp_bf16
compare lora_cpu_bf16 lora_gpu_bf16 1e-2 6 && pass "LoRA under amp_bf16 (the base held in bf16): the GPU follows the CPU"   || fail "LoRA amp_bf16 GPU against CPU"

# One rank still gathers (ZeRO-2/3) and reduce-scatters (ZeRO-3) through NCCL; its all-reduce is
# anvil doctor's self-test. The emulated GPU build has no NCCL.
if ! grep -q "^gpu collectives: none" <<< "$doctor_report"; then
  for stage in 2 3; do
    run "gpu_det_nccl_z$stage" kernels=gpu "${det[@]}" distributed.gpu_collectives=nccl \
      distributed.zero_stage=$stage
  done
  if grep -q "collectives: NCCL" "$tmp/gpu_det_nccl_z2.out" && [ "$(digest gpu_det)" = "$(digest gpu_det_nccl_z2)" ] \
    && [ "$(digest gpu_det)" = "$(digest gpu_det_nccl_z3)" ]; then
    pass "deterministic_mode through NCCL (one rank, ZeRO 2 and 3): the same weights bit for bit"
  else
    fail "deterministic_mode through NCCL: $(grep -i error "$tmp"/gpu_det_nccl_z*.out | head -2)"
  fi
else
  echo "skipped: NCCL (this build has none: $(grep '^gpu backend' <<< "$doctor_report"))"
fi
exit $((failures > 0))
