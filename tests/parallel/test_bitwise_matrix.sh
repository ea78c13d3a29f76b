#!/usr/bin/env bash
# The determinism matrix: 20 steps of a bench-16m-shaped model (4 layers, 4 heads, d_model 256;
# to keep CI short, sequences of 64 tokens and a 1024-token cut of GPT-2's vocabulary,
# tests/lib.sh's small_gpt2_vocab) on Brown, global batch
# 12, under every grouping the issue names: 1 rank with microbatch 8 (8 + 4), 2 ranks with
# microbatch 4 and 1, 4 ranks with microbatch 2 (2 + 1), 3 ranks with microbatch 4, across ZeRO
# stages 0-3. Every run must end with the same weight digest and the same loss at every step.
# Then the other families, smaller (2 layers, d_model 128), with dropout (its masks keyed by the
# step and each sequence's index in the batch): an MPT with ALiBi, QK LayerNorm and no biases (tied head, no
# position table; embedding, attention and residual dropout) and a Llama with grouped-query heads
# (RoPE, SwiGLU, RMSNorm, its own LM head; attention dropout), each on 1 rank, 2 ranks under
# ZeRO-3 with activation checkpointing, 3 ranks, 4 ranks, and 2 ranks stopped at step 8 and resumed.
# Pipeline parallelism (distributed.pipeline_parallel) among them: the GPT-2 as 2 stages of 2
# ranks (ZeRO-1), as 4 stages of one rank (4 microbatches through them, the whole 1F1B
# schedule), and resumed as 2 stages of 2 from a run stopped on 3 ranks at step 8; each family
# as 2 stages of 2 ranks (the Llama with activation checkpointing), and stopped at step 8 as 2
# stages, resumed on 3 ranks without stages. Then tensor parallelism, on models whose ranks hold
# whole k blocks and on ones whose blocks straddle ranks.
# Last, an MPT whose MLPs are mixtures of experts, with and without expert parallelism (each rank
# holding its experts' weights alone), as 2 pipeline stages, and fine-tuned with LoRA.
# Usage: test_bitwise_matrix.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
here="$(cd "$(dirname "$0")" && pwd)"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=1  # up to 4 ranks share 2 cores
start_test

small_gpt2_vocab "$src" "$tmp/vocab" && prepare_brown_news "$anvil" "$src" "$tmp" 64 "$tmp/vocab" \
  || { echo "FAIL: data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml at 64 tokens, grown to 4 layers of width 256 with 4 heads.
m=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" max_seq_len=64 model.n_layers=4 model.n_heads=4
   model.d_model=256 eval_loader=null optimizer.lr=6.0e-4 scheduler.t_warmup=5ba max_duration=20ba
   global_train_batch_size=12 seed=5)

# train NAME RANKS MICROBATCH ZERO_STAGE [OVERRIDES...]
train() {
  local name="$1" np="$2" mb="$3" zero="$4"
  shift 4
  if ! train_run tiny-gpt2 "$name" "$np" "${m[@]}" device_train_microbatch_size="$mb" distributed.zero_stage="$zero" \
      "$@"; then
    fail "$name: training on $np rank(s) failed"; tail -20 "$tmp/$name.out"
  fi
}
OMP_NUM_THREADS=2 train w1_mb8_z0 1 8 0  # the reference, with both cores
train w2_mb4_z1 2 4 1
train w2_mb1_z2 2 1 2
train w4_mb2_z3 4 2 3
train w3_mb4_z2 3 4 2
train w4_mb2_z0 4 2 0
train w1_mb8_z3 1 8 3
train w4_pp2_mb2_z1 4 2 1 distributed.pipeline_parallel=2
train w4_pp4_mb3_z0 4 3 0 distributed.pipeline_parallel=4
# Stopped at step 8 on 3 ranks without stages, resumed as 2 stages of 2 ranks.
train w3_then_pp2 3 4 2 max_duration=8ba scheduler.t_max=20ba
train w3_then_pp2 4 2 1 distributed.pipeline_parallel=2 scheduler.t_max=20ba autoresume=true
grep -q "resumed from .*step-00000008" "$tmp/w3_then_pp2.out" || fail "the pipeline did not resume from step 8"

/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/w1_mb8_z0" "$tmp/w2_mb4_z1" "$tmp/w2_mb1_z2" "$tmp/w4_mb2_z3" \
  "$tmp/w3_mb4_z2" "$tmp/w4_mb2_z0" "$tmp/w1_mb8_z3" "$tmp/w4_pp2_mb2_z1" "$tmp/w4_pp4_mb3_z0" "$tmp/w3_then_pp2" \
  || fail "the runs do not all end with the same bits"
echo "reference: $(grep -c '"loss"' "$tmp/w1_mb8_z0/metrics.jsonl") steps, weights sha256 $("$anvil" inspect "$tmp/w1_mb8_z0" | sed -n 's/^weights sha256: //p')"

family() {
  local family="$1"; shift
  local model="model.n_layers=2 model.d_model=128 $*"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=2 train "${family}_w1_mb8_z0" 1 8 0 model.name="$family" $model
  # shellcheck disable=SC2086
  train "${family}_w2_mb1_z3_ckpt" 2 1 3 model.name="$family" $model activation_checkpointing=true
  # shellcheck disable=SC2086
  train "${family}_w3_mb4_z2" 3 4 2 model.name="$family" $model
  # shellcheck disable=SC2086
  train "${family}_w4_mb2_z0" 4 2 0 model.name="$family" $model
  # Stopped at step 8 on 2 ranks (ZeRO-1), resumed from its checkpoint to step 20; the schedule's
  # length is given so that the stopped run's learning rates are the whole run's.
  # shellcheck disable=SC2086
  train "${family}_w2_mb2_z1_resume" 2 2 1 model.name="$family" $model max_duration=8ba scheduler.t_max=20ba
  # shellcheck disable=SC2086
  train "${family}_w2_mb2_z1_resume" 2 2 1 model.name="$family" $model scheduler.t_max=20ba autoresume=true
  grep -q "resumed from .*step-00000008" "$tmp/${family}_w2_mb2_z1_resume.out" \
    || fail "$family: the second part did not resume from step 8"
  # shellcheck disable=SC2086
  train "${family}_w4_pp2_mb2_z1" 4 2 1 model.name="$family" $model distributed.pipeline_parallel=2 $pipelined
  # shellcheck disable=SC2086
  train "${family}_pp2_then_w3" 2 3 0 model.name="$family" $model distributed.pipeline_parallel=2 max_duration=8ba \
    scheduler.t_max=20ba
  # shellcheck disable=SC2086
  train "${family}_pp2_then_w3" 3 4 2 model.name="$family" $model scheduler.t_max=20ba autoresume=true
  grep -q "resumed from .*step-00000008" "$tmp/${family}_pp2_then_w3.out" \
    || fail "$family: the run without stages did not resume from the pipeline's step 8"
  /usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/${family}_w1_mb8_z0" "$tmp/${family}_w2_mb1_z3_ckpt" \
    "$tmp/${family}_w3_mb4_z2" "$tmp/${family}_w4_mb2_z0" "$tmp/${family}_w2_mb2_z1_resume" \
    "$tmp/${family}_w4_pp2_mb2_z1" "$tmp/${family}_pp2_then_w3" \
    || fail "$family: the runs do not all end with the same bits"
  echo "$family: weights sha256 $("$anvil" inspect "$tmp/${family}_w1_mb8_z0" | sed -n 's/^weights sha256: //p')"
}
pipelined=""
family mpt_causal_lm model.no_bias=true model.attn_config.alibi=true model.attn_config.qk_ln=true model.emb_pdrop=0.1 \
  model.resid_pdrop=0.1 model.attn_config.attn_pdrop=0.1
pipelined="activation_checkpointing=true"
family llama model.n_kv_heads=2 model.attention_dropout=0.1

# Tensor parallelism (distributed.tensor_parallel): a GPT-2 of 2 heads of 256 channels, so that a
# rank's share of each product's k is a whole number of the GEMM's k blocks, and of a 4200-id
# vocabulary (two of the cross-entropy's sum blocks to the first rank, 104 ids to the second),
# with dropout: 1 rank;
# 2 ranks sharing each block; 4 ranks as 2 copies of 2 (ZeRO-3); 4 ranks as 2 pipeline stages of
# 2 sharing ranks (ZeRO-1); and stopped at step 8 on 2 ranks sharing the blocks, resumed on 3
# without. Then a Llama with grouped-query heads (q, k and v each cut; SwiGLU's gate and up each
# cut; its own LM head on the last stage) on 1 rank and as 2 stages of 2 sharing ranks with
# activation checkpointing; and a Qwen3 (the Llama with per-head QK norms) on 1 rank and on 2
# sharing ranks, in microbatches of 3 (a sequence's rows of the residual stream on both ranks).
# Then a narrower GPT-2 whose ranks' channels are not whole k blocks, on 1, 2 and 3 ranks, and an
# MPT of that width with qk_ln on 1, 2 and 3 ranks.
tp=(model.n_layers=2 model.d_model=512 model.n_heads=2 model.resid_pdrop=0.1 model.attn_pdrop=0.1
    model.embd_pdrop=0.1 model.vocab_size=4200)
OMP_NUM_THREADS=2 train tp_w1_mb8_z0 1 8 0 "${tp[@]}"
train tp_w2_tp2_mb4_z0 2 4 0 "${tp[@]}" distributed.tensor_parallel=2
train tp_w4_tp2_mb2_z3 4 2 3 "${tp[@]}" distributed.tensor_parallel=2
train tp_w4_tp2_pp2_mb3_z1 4 3 1 "${tp[@]}" distributed.tensor_parallel=2 distributed.pipeline_parallel=2
train tp2_then_w3 2 4 1 "${tp[@]}" distributed.tensor_parallel=2 max_duration=8ba scheduler.t_max=20ba
train tp2_then_w3 3 4 1 "${tp[@]}" scheduler.t_max=20ba autoresume=true
grep -q "resumed from .*step-00000008" "$tmp/tp2_then_w3.out" \
  || fail "tensor parallelism: the run without it did not resume from step 8"
grep -q "tensor parallelism: 2 ranks share each of 2 copies of the model" "$tmp/tp_w4_tp2_mb2_z3/train.log" \
  || fail "tensor parallelism: the run log does not say how the model is shared"
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/tp_w1_mb8_z0" "$tmp/tp_w2_tp2_mb4_z0" "$tmp/tp_w4_tp2_mb2_z3" \
  "$tmp/tp_w4_tp2_pp2_mb3_z1" "$tmp/tp2_then_w3" \
  || fail "tensor parallelism: the runs do not all end with the same bits"
tp_llama=(model.name=llama model.n_layers=2 model.d_model=512 model.n_heads=4 model.n_kv_heads=2 model.head_dim=256
          model.intermediate_size=1024 model.attention_dropout=0.1 model.vocab_size=4200)
OMP_NUM_THREADS=2 train tp_llama_w1_mb8_z0 1 8 0 "${tp_llama[@]}"
train tp_llama_w4_tp2_pp2_mb2_z1_ckpt 4 2 1 "${tp_llama[@]}" distributed.tensor_parallel=2 \
  distributed.pipeline_parallel=2 activation_checkpointing=true
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/tp_llama_w1_mb8_z0" "$tmp/tp_llama_w4_tp2_pp2_mb2_z1_ckpt" \
  || fail "tensor parallelism: the Llama's runs do not end with the same bits"
tp_qwen3=("${tp_llama[@]}" model.name=qwen3)
OMP_NUM_THREADS=2 train tp_qwen3_w1_mb8_z0 1 8 0 "${tp_qwen3[@]}"
train tp_qwen3_w2_tp2_mb3_z1 2 3 1 "${tp_qwen3[@]}" distributed.tensor_parallel=2
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/tp_qwen3_w1_mb8_z0" "$tmp/tp_qwen3_w2_tp2_mb3_z1" \
  || fail "tensor parallelism: the Qwen3's runs do not end with the same bits"
# A GPT-2 of 6 heads of 64: 192 query channels a rank on 2 ranks and 128 on 3, so blocks of the
# GEMM's k straddle the ranks (added whole by the rank holding a block's end).
tp_narrow=("${tp[@]}" model.d_model=384 model.n_heads=6)
OMP_NUM_THREADS=2 train tp_narrow_w1_mb8_z0 1 8 0 "${tp_narrow[@]}"
train tp_narrow_w2_tp2_mb3_z1 2 3 1 "${tp_narrow[@]}" distributed.tensor_parallel=2
train tp_narrow_w3_tp3_mb4_z0 3 4 0 "${tp_narrow[@]}" distributed.tensor_parallel=3
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/tp_narrow_w1_mb8_z0" "$tmp/tp_narrow_w2_tp2_mb3_z1" \
  "$tmp/tp_narrow_w3_tp3_mb4_z0" || fail "tensor parallelism: the narrow GPT-2's runs do not end with the same bits"
# An MPT with qk_ln (one norm over all the heads' queries, and one over the keys, whose statistics
# span the ranks) and ALiBi, as narrow: 1 rank, 2 and 3 sharing ranks.
tp_mpt=(model.name=mpt_causal_lm model.n_layers=2 model.d_model=384 model.n_heads=6 model.vocab_size=4200
        model.no_bias=true model.attn_config.alibi=true model.attn_config.qk_ln=true model.emb_pdrop=0.1
        model.resid_pdrop=0.1 model.attn_config.attn_pdrop=0.1)
OMP_NUM_THREADS=2 train tp_mpt_w1_mb8_z0 1 8 0 "${tp_mpt[@]}"
train tp_mpt_w2_tp2_mb4_z2 2 4 2 "${tp_mpt[@]}" distributed.tensor_parallel=2
train tp_mpt_w3_tp3_mb4_z0 3 4 0 "${tp_mpt[@]}" distributed.tensor_parallel=3
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/tp_mpt_w1_mb8_z0" "$tmp/tp_mpt_w2_tp2_mb4_z2" \
  "$tmp/tp_mpt_w3_tp3_mb4_z0" || fail "tensor parallelism: the MPT's runs (qk_ln) do not end with the same bits"
echo "tensor parallelism: weights sha256 $("$anvil" inspect "$tmp/tp_w1_mb8_z0" | sed -n 's/^weights sha256: //p')"

# A mixture of experts (mb_moe: four experts, top 2, capacity factor 1, so that experts fill and
# skip choices; residual dropout): 1 rank; 2 ranks sharing the experts (expert parallelism) under
# ZeRO-3 with activation checkpointing; 4 ranks running an expert each; 3 ranks; 2 pipeline
# stages of 2 ranks (each stage's blocks report their balancing loss and skips), with and without
# the stage's 2 ranks sharing the experts; 4 ranks as two groups of 2 sharing the experts (each
# expert held by 2 ranks) under ZeRO-1, 2 and 3; and 2 ranks sharing the experts stopped at step 8
# and resumed on 4 as two groups of 2.
moe=(model.name=mpt_causal_lm model.n_layers=2 model.d_model=128 model.no_bias=true model.attn_config.alibi=true
     model.ffn_config.ffn_type=mb_moe model.ffn_config.moe_num_experts=4 model.ffn_config.moe_top_k=2
     model.ffn_config.moe_capacity_factor=1.0 model.resid_pdrop=0.1)
OMP_NUM_THREADS=2 train moe_w1_mb8_z0 1 8 0 "${moe[@]}"
train moe_w2_ep2_mb1_z3_ckpt 2 1 3 "${moe[@]}" distributed.expert_parallel=2 activation_checkpointing=true
train moe_w4_ep4_mb2_z1 4 2 1 "${moe[@]}" distributed.expert_parallel=4
train moe_w3_mb4_z2 3 4 2 "${moe[@]}"
train moe_w4_pp2_mb2_z1 4 2 1 "${moe[@]}" distributed.pipeline_parallel=2
train moe_w4_pp2_ep2_mb1_z1 4 1 1 "${moe[@]}" distributed.pipeline_parallel=2 distributed.expert_parallel=2
train moe_w4_ep2_mb2_z1 4 2 1 "${moe[@]}" distributed.expert_parallel=2
train moe_w4_ep2_mb1_z2 4 1 2 "${moe[@]}" distributed.expert_parallel=2
train moe_w4_ep2_mb2_z3 4 2 3 "${moe[@]}" distributed.expert_parallel=2
train moe_w2_then_w4 2 2 1 "${moe[@]}" distributed.expert_parallel=2 max_duration=8ba scheduler.t_max=20ba
train moe_w2_then_w4 4 1 0 "${moe[@]}" distributed.expert_parallel=2 scheduler.t_max=20ba autoresume=true
grep -q "resumed from .*step-00000008" "$tmp/moe_w2_then_w4.out" \
  || fail "moe: the second part did not resume from step 8"
grep -q "expert parallelism: 4 ranks share the experts, 1 each" "$tmp/moe_w4_ep4_mb2_z1/train.log" \
  || fail "moe: the run log does not say how the experts are shared"
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/moe_w1_mb8_z0" "$tmp/moe_w2_ep2_mb1_z3_ckpt" \
  "$tmp/moe_w4_ep4_mb2_z1" "$tmp/moe_w3_mb4_z2" "$tmp/moe_w4_pp2_mb2_z1" "$tmp/moe_w4_pp2_ep2_mb1_z1" \
  "$tmp/moe_w4_ep2_mb2_z1" "$tmp/moe_w4_ep2_mb1_z2" "$tmp/moe_w4_ep2_mb2_z3" "$tmp/moe_w2_then_w4" \
  || fail "moe: the runs do not all end with the same bits"
# Every step logs the balancing loss (near loss_weight 0.1, its value when balanced) and the
# share of choices skipped, the same in every layout, and under expert parallelism the MiB the
# ranks sent each other: each kept choice's row of d_model floats crosses twice forward and twice
# back when its expert is on another rank (3 of 4 here), so about 4·(3/4)·kept·512 bytes a layer.
/usr/bin/python3 - "$tmp/moe_w1_mb8_z0/metrics.jsonl" "$tmp/moe_w3_mb4_z2/metrics.jsonl" \
  "$tmp/moe_w4_ep4_mb2_z1/metrics.jsonl" "$tmp/moe_w4_pp2_mb2_z1/metrics.jsonl" \
  "$tmp/moe_w4_pp2_ep2_mb1_z1/metrics.jsonl" <<'PY' \
  || fail "moe: the balancing loss, skipped choices or all-to-all volume are not logged, or differ between layouts"
import json, sys
rows = [[r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:]]
runs = [[(r["moe_balance_loss"], r["moe_skipped_choices"]) for r in run] for run in rows]
assert len(runs[0]) == 20 and runs[0] == runs[1] == runs[2] == runs[3] == runs[4], runs
assert all(0.05 < b < 0.5 and 0 < s < 0.5 for b, s in runs[0]), runs[0]
choices = 12 * 64 * 2 * 2  # sequences x tokens x top_k x layers, each step
for r in rows[2]:
    expected = 4 * 0.75 * choices * (1 - r["moe_skipped_choices"]) * 512 / 2**20
    assert 0.8 * expected < r["moe_all_to_all_mib"] < 1.2 * expected, (r["moe_all_to_all_mib"], expected)
assert "moe_all_to_all_mib" not in rows[0][0]
print(f"  all-to-all: {rows[2][0]['moe_all_to_all_mib']:.2f} MiB at step 1 on 4 ranks of one expert each")
PY
# Each rank holds its experts alone: on 4 ranks of one expert each (ZeRO-1 over the one rank
# holding the same expert), the parameters and both moments of 3 of the 4 experts of each of the 2
# layers (fc 512x128 and fcproj 128x512 each) are not there; with 2 ranks of 2 experts under ZeRO-3,
# half of them.
/usr/bin/python3 - "$tmp/moe_w1_mb8_z0/metrics.jsonl" "$tmp/moe_w4_ep4_mb2_z1/metrics.jsonl" \
  "$tmp/moe_w2_ep2_mb1_z3_ckpt/metrics.jsonl" <<'PY' || fail "moe: a rank under expert parallelism holds other experts"
import json, sys
mem = [next(r["memory_per_rank"] for r in map(json.loads, open(p)) if "memory_per_rank" in r) for p in sys.argv[1:]]
expert = 2 * 4 * 2 * 512 * 128 * 4  # bytes of every expert's weights
for m, held in ((mem[1], 1 / 4), (mem[2], 2 / 4)):
    assert m["expert_parallel"] == round(1 / held), m
    assert mem[0]["params"] - m["params"] == expert * (1 - held), (mem[0], m)
    assert mem[0]["optimizer"] - m["optimizer"] == 2 * expert * (1 - held), (mem[0], m)
print(f"  params per rank: {mem[0]['params']} bytes on 1 rank, {mem[1]['params']} with one expert of 4")
PY
# LoRA on the trained mixture of experts (all-linear: attention and router adapted, the experts
# frozen): 1 rank, and 2 ranks sharing the experts under ZeRO-3, end with the same adapters.
lora=(load_path="$tmp/moe_w1_mb8_z0" "model.peft_config={peft_type: LORA, r: 4, target_modules: all-linear}"
      max_duration=6ba)
OMP_NUM_THREADS=2 train moe_lora_w1 1 6 0 "${moe[@]}" "${lora[@]}"
train moe_lora_w2_ep2_z3 2 1 3 "${moe[@]}" "${lora[@]}" distributed.expert_parallel=2
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/moe_lora_w1" "$tmp/moe_lora_w2_ep2_z3" \
  || fail "moe: LoRA's adapters differ between one rank and two sharing the experts"
echo "moe: weights sha256 $("$anvil" inspect "$tmp/moe_w1_mb8_z0" | sed -n 's/^weights sha256: //p')"
[ "$failures" -eq 0 ]
