#!/usr/bin/env bash
# Mixed precision as a user runs it: a small GPT-2 on the Brown corpus (news) for 60 steps in
# fp32, amp_bf16 and amp_fp16; each 16-bit run's final eval loss within 2% of fp32's. Then
# amp_fp16 started at a loss scale of 2^40: the overflowing steps are reported and skipped, the
# scale backs off, and the run still trains (the loss falls) and resumes with its scale.
# Usage: test_precision.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=2
start_test

prepare_brown_news "$anvil" "$src" "$tmp" || { echo "FAIL: data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml at width 64 on GPT-2's whole vocabulary, 60 steps.
r=("$src/tests/configs/tiny-gpt2.yaml" variables.data="$tmp/data" variables.tokenizer=gpt2 model.d_model=64
   model.vocab_size=50257 train_loader.num_workers=1 scheduler.t_warmup=5ba scheduler.t_max=60ba max_duration=60ba
   eval_interval=60ba eval_first=true eval_subset_num_batches=4 save_interval=30ba)
final_eval() { sed -n 's/^eval loss: [0-9.]* before training, \([0-9.]*\) after.*/\1/p' "$1"; }
for p in fp32 amp_bf16 amp_fp16; do
  "$anvil" train "${r[@]}" run_dir="$tmp/$p" precision=$p > "$tmp/$p.out" 2>&1 || { fail "$p run"; tail "$tmp/$p.out"; }
done
ref=$(final_eval "$tmp/fp32.out")
for p in amp_bf16 amp_fp16; do
  got=$(final_eval "$tmp/$p.out")
  /usr/bin/python3 -c "import sys; r, g = float('$ref'), float('$got'); sys.exit(0 if abs(g - r) <= 0.02 * r else 1)" \
    && pass "$p: final eval loss $got, fp32 $ref (within 2%)" || fail "$p: final eval loss '$got', fp32 '$ref'"
done

# An overflow at the start: skipped, reported, backed off, recovered.
"$anvil" train "${r[@]}" run_dir="$tmp/ov" precision=amp_fp16 loss_scaler.init_scale=1099511627776 \
  loss_scaler.growth_interval=10 max_duration=30ba > "$tmp/ov.out" 2>&1 || { fail "overflow run"; tail "$tmp/ov.out"; }
skipped=$(sed -n 's/^skipped steps (fp16 overflow): //p' "$tmp/ov.out")
first=$(grep -m1 '"loss"' "$tmp/ov/metrics.jsonl" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['loss_scale'])")
last=$(grep '"loss"' "$tmp/ov/metrics.jsonl" | tail -1 | /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); print(r['loss_scale'], r['loss'])")
grep -q "step 1: fp16 gradients overflowed at loss scale 2^40; step skipped" "$tmp/ov.out" && [ "${skipped:-0}" -gt 0 ] \
  && /usr/bin/python3 -c "import sys; s, l = map(float, '$last'.split()); sys.exit(0 if s < 2**40 and l < 10.5 else 1)" \
  && pass "loss scale 2^40: $skipped steps skipped and reported, then training at scale/loss $last (first $first)" \
  || fail "overflow recovery: skipped '$skipped', last scale/loss '$last'"
grep -q '"loss_scaler"' "$tmp/ov/checkpoints/step-00000030/manifest.json" \
  && "$anvil" train "${r[@]}" run_dir="$tmp/ov" precision=amp_fp16 loss_scaler.init_scale=1099511627776 \
       loss_scaler.growth_interval=10 max_duration=40ba autoresume=true > "$tmp/ov2.out" 2>&1 \
  && ! grep -q "overflowed at loss scale 2^40" "$tmp/ov2.out" \
  && pass "the checkpoint holds the loss scaler; the resumed run continues at its scale, not 2^40" \
  || { fail "loss scaler resume"; tail -3 "$tmp/ov2.out"; }
[ "$failures" -eq 0 ]
