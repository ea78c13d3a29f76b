#!/usr/bin/env bash
# LoRA as a user does it: pretrain a small GPT-2, fine-tune LoRA adapters on it (model.peft_config)
# with instruction records written from the Brown corpus, watch the held-out loss fall, merge and
# export, re-import, and find the same held-out loss everywhere: anvil's eval of the adapter
# checkpoint, of the merged export and of its re-import, and PyTorch's (tests/interop/
# hf_reference.py) on the exported base with the PEFT adapter files on top. The adapter runs keep
# the determinism contract (microbatch, world size, ZeRO stage, resume, LoRA dropout) and bad
# input is a one-line error, a base that changed under its adapters included.
# Usage: test_lora.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test

pretrain_for_finetuning "$anvil" "$src" || { failures=1; exit 1; }
have_mpirun || skip "the 2-rank runs (no mpirun): the digests below compare the 1-rank runs"
loss_of() { /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])["loss"])'; }
# close A B REL: |A - B| <= REL * |B|
close() { /usr/bin/python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= float(sys.argv[3]) * abs(b) else 1)" "${1:-nan}" "${2:-nan}" "$3"; }

# tests/configs/tiny-sft.yaml with LoRA adapters (r 8) on c_attn, c_proj and c_fc: every product of a block.
lora=("$src/tests/configs/tiny-sft.yaml" variables.records="$tmp/records" variables.tokenizer="$tmp/vocab"
      variables.pretrained="$tmp/pre" optimizer.lr=1.0e-2
      "model.peft_config={peft_type: LORA, r: 8, lora_alpha: 16, target_modules: [c_attn, c_proj, c_fc]}")

if "$anvil" train "${lora[@]}" run_dir="$tmp/lora" > "$tmp/lora.out" 2>&1; then
  read -r before mid after <<< "$(eval_losses "$tmp/lora")"
  close "$after" "$before" 0 && fail "the held-out loss did not move" || true
  if /usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.9 * float(sys.argv[1]) else 1)" \
       "$before" "$after"; then
    pass "LoRA on the pretrained model: held-out response loss $before -> $mid -> $after"
  else
    fail "the held-out loss did not fall enough: $before -> $mid -> $after"
  fi
  base_digest=$(checkpoint_digest "$tmp/pre")
  grep -q "LoRA: the frozen base is '$tmp/pre' (weights sha256 $base_digest); r 8, alpha 16" "$tmp/lora/train.log" \
    && pass "the frozen base and the adapters are logged" || { fail "LoRA log line"; grep LoRA "$tmp/lora/train.log"; }
  # The checkpoint holds the adapters alone (r·(in + out) per module and block) and names its base.
  ckpt=$(ls -d "$tmp/lora/checkpoints"/step-* | tail -1)
  adapters=$((2 * 8 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))))
  if /usr/bin/python3 - "$ckpt/manifest.json" "$tmp/pre" "$base_digest" "$adapters" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
n = sum(eval("*".join(map(str, t["shape"]))) for t in m["tensors"])
assert all(".lora_A" in t["name"] or ".lora_B" in t["name"] for t in m["tensors"]), "a base tensor is saved"
assert n == int(sys.argv[4]), f"{n} values saved, expected {sys.argv[4]}"
assert m["lora_base"] == {"path": sys.argv[2], "weights_sha256": sys.argv[3]}, m["lora_base"]
PY
  then
    pass "the checkpoint holds the $adapters adapter values and names its base by path and digest"
  else
    fail "adapter checkpoint contents"
  fi

  got=$("$anvil" eval "$ckpt" --data "$tmp/lora/finetuning_data" --split eval 2>/dev/null | loss_of)
  close "$got" "$after" 1e-6 && pass "anvil eval of the adapter checkpoint: $got (the run's last eval: $after)" \
    || fail "anvil eval of the adapter checkpoint gave '$got', the run's last eval $after"

  # Merged: the adapters folded into the base, as transformers loads it; then imported back.
  "$anvil" export "$ckpt" "$tmp/merged" --merge-lora > "$tmp/merge.out" 2>&1 || { fail "export --merge-lora"; cat "$tmp/merge.out"; }
  "$anvil" import "$tmp/merged" "$tmp/reimported" > /dev/null 2>&1 || fail "re-import of the merged export"
  merged=$("$anvil" eval "$tmp/merged" --data "$tmp/lora/finetuning_data" --split eval 2>/dev/null | loss_of)
  reimported=$("$anvil" eval "$tmp/reimported" --data "$tmp/lora/finetuning_data" --split eval 2>/dev/null | loss_of)
  if close "$merged" "$after" 1e-5 && close "$reimported" "$after" 1e-5; then
    pass "merged and exported: $merged; re-imported: $reimported (the adapter model's $after)"
  else
    fail "merged export '$merged', re-imported '$reimported', adapter model $after"
  fi
  # PEFT's files on the exported base, read by PyTorch following PEFT's definition.
  "$anvil" export "$ckpt" "$tmp/adapter" --adapter > /dev/null 2>&1 || fail "export --adapter"
  "$anvil" export "$tmp/pre" "$tmp/base-hf" > /dev/null 2>&1 || fail "export of the base"
  ref=$(/usr/bin/python3 "$src/tests/interop/hf_reference.py" loss "$tmp/base-hf" "$tmp/lora/finetuning_data/eval" \
        1000 --adapter "$tmp/adapter" | loss_of)
  close "$ref" "$after" 1e-5 && pass "PyTorch on the exported base with PEFT's adapter files: $ref" \
    || fail "PyTorch with the adapter gives '$ref', anvil $after"
  expect_error "a plain export of adapters" "holds LoRA adapters, not a whole model: export --merge-lora" \
    "$anvil" export "$ckpt" "$tmp/x1"
  expect_error "--merge-lora on a whole model" "--merge-lora: '.*' holds no LoRA adapters" \
    "$anvil" export "$tmp/pre" "$tmp/x2" --merge-lora
else
  fail "LoRA run"; tail -5 "$tmp/lora.out"
fi

# The determinism contract: 6 steps cut as microbatches of 8 or 2, on 1 rank or 2 (ZeRO-1 and
# ZeRO-3), interrupted and resumed, with activation checkpointing; then with lora_dropout, whose
# masks are the same bits however the batch is cut; and under amp_bf16 (the base held in bf16).
short=(max_duration=6ba eval_interval=6ba eval_first=false)
"$anvil" train "${lora[@]}" "${short[@]}" save_interval=3ba run_dir="$tmp/d8" > "$tmp/d8.out" 2>&1
"$anvil" train "${lora[@]}" "${short[@]}" device_train_microbatch_size=2 run_dir="$tmp/d2" > "$tmp/d2.out" 2>&1
"$anvil" train "${lora[@]}" "${short[@]}" activation_checkpointing=true run_dir="$tmp/ac" > "$tmp/ac.out" 2>&1
have_mpirun && mpirun_anvil 2 "$anvil" train "${lora[@]}" "${short[@]}" distributed.zero_stage=1 run_dir="$tmp/z1" \
  > "$tmp/z1.out" 2>&1
have_mpirun && mpirun_anvil 2 "$anvil" train "${lora[@]}" "${short[@]}" distributed.zero_stage=3 device_train_microbatch_size=4 \
  run_dir="$tmp/z3" > "$tmp/z3.out" 2>&1
# The run stopped after its step-3 checkpoint: the same run, resumed.
cp -r "$tmp/d8" "$tmp/resumed"
rm -rf "$tmp/resumed/checkpoints/step-00000006"
echo step-00000003 > "$tmp/resumed/checkpoints/latest"
"$anvil" train "${lora[@]}" "${short[@]}" save_interval=3ba autoresume=true run_dir="$tmp/resumed" \
  > "$tmp/resumed.out" 2>&1
d8=$(checkpoint_digest "$tmp/d8")
if [ -n "$d8" ] && [ "$d8" = "$(checkpoint_digest "$tmp/d2")" ] && { ! have_mpirun || [ "$d8" = "$(checkpoint_digest "$tmp/z1")" ]; } &&
   { ! have_mpirun || [ "$d8" = "$(checkpoint_digest "$tmp/z3")" ]; } && [ "$d8" = "$(checkpoint_digest "$tmp/resumed")" ] && [ "$d8" = "$(checkpoint_digest "$tmp/ac")" ] &&
   grep -q "resumed from $tmp/resumed/checkpoints/step-00000003" "$tmp/resumed/train.log"; then
  pass "one adapter digest for microbatch 8 and 2, 2 ranks under ZeRO-1 and ZeRO-3, a resumed run and activation checkpointing: ${d8:0:16}"
else
  fail "LoRA digests: $d8 / $(checkpoint_digest "$tmp/d2") / $(checkpoint_digest "$tmp/z1") / $(checkpoint_digest "$tmp/z3") / $(checkpoint_digest "$tmp/resumed") / $(checkpoint_digest "$tmp/ac")"
  tail -2 "$tmp/d2.out" "$tmp/z1.out" "$tmp/z3.out" "$tmp/resumed.out"
fi
drop=("${short[@]}" model.peft_config.lora_dropout=0.1)
"$anvil" train "${lora[@]}" "${drop[@]}" run_dir="$tmp/p8" > "$tmp/p8.out" 2>&1
"$anvil" train "${lora[@]}" "${drop[@]}" device_train_microbatch_size=2 run_dir="$tmp/p2" > "$tmp/p2.out" 2>&1
have_mpirun && mpirun_anvil 2 "$anvil" train "${lora[@]}" "${drop[@]}" distributed.zero_stage=2 run_dir="$tmp/pz2" \
  > "$tmp/pz2.out" 2>&1
p8=$(checkpoint_digest "$tmp/p8")
if [ -n "$p8" ] && [ "$p8" = "$(checkpoint_digest "$tmp/p2")" ] && { ! have_mpirun || [ "$p8" = "$(checkpoint_digest "$tmp/pz2")" ]; } && [ "$p8" != "$d8" ]; then
  pass "lora_dropout 0.1: one digest for microbatch 8 and 2 and 2 ranks (ZeRO-2): ${p8:0:16}"
else
  fail "LoRA dropout digests: $p8 / $(checkpoint_digest "$tmp/p2") / $(checkpoint_digest "$tmp/pz2")"; tail -2 "$tmp/p8.out" "$tmp/pz2.out"
fi

"$anvil" train "${lora[@]}" "${short[@]}" precision=amp_bf16 run_dir="$tmp/b8" > "$tmp/b8.out" 2>&1
"$anvil" train "${lora[@]}" "${short[@]}" precision=amp_bf16 device_train_microbatch_size=2 run_dir="$tmp/b2" \
  > "$tmp/b2.out" 2>&1
b8=$(checkpoint_digest "$tmp/b8")
if [ -n "$b8" ] && [ "$b8" = "$(checkpoint_digest "$tmp/b2")" ] && [ "$b8" != "$d8" ] &&
   grep -q "LoRA's frozen base" "$tmp/b8/train.log"; then
  pass "amp_bf16, the base held in bf16: one digest for microbatch 8 and 2: ${b8:0:16}"
else
  fail "LoRA amp_bf16 digests: $b8 / $(checkpoint_digest "$tmp/b2")"; tail -2 "$tmp/b8.out"
fi

# Bad input: one line each.
expect_error "r 0" "model.peft_config.r = 0 must be a positive rank" \
  "$anvil" train "${lora[@]}" model.peft_config.r=0 run_dir="$tmp/e1"
expect_error "a target module the family lacks" "'q_proj' names no module of a GPT-2 block" \
  "$anvil" train "${lora[@]}" "model.peft_config.target_modules=[c_attn, q_proj]" run_dir="$tmp/e2"
expect_error "LoRA without a base" "model.peft_config (LoRA) adapts a pretrained model: set load_path" \
  "$anvil" train "${lora[@]}" load_path=null run_dir="$tmp/e3"
# The base changes under its adapters: the adapters' checkpoint no longer fits it.
cp -r "$tmp/pre" "$tmp/base2"
"$anvil" train "${lora[@]}" max_duration=2ba eval_first=false load_path="$tmp/base2" run_dir="$tmp/on2" \
  > "$tmp/on2.out" 2>&1 || fail "LoRA on a copy of the base"
rm -rf "$tmp/base2"
"$anvil" import "$tmp/merged" "$tmp/base2" > /dev/null 2>&1
expect_error "eval of adapters whose base changed" "its adapters were trained on a base whose weights have sha256" \
  "$anvil" eval "$tmp/on2" --data "$tmp/lora/finetuning_data" --split eval
expect_failure "resuming adapters whose base changed" "its adapters were trained on a base whose weights have sha256" \
  "$anvil" train "${lora[@]}" max_duration=4ba eval_first=false load_path="$tmp/base2" autoresume=true \
  run_dir="$tmp/on2"
expect_error "merging adapters whose base changed" "its adapters were trained on a base whose weights have sha256" \
  "$anvil" export "$tmp/on2" "$tmp/x3" --merge-lora

[ "$failures" -eq 0 ]
