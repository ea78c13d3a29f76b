#!/usr/bin/env bash
# anvil export, checked by a reader that is not anvil's (tests/interop/hf_reference.py: the
# safetensors format parsed from its definition, the model rebuilt from config.json and
# transformers' tensor names as transformers' modeling files compute it):
# - GPT-2, a Llama with grouped-query heads and its own LM head (trained on 2 ranks under ZeRO-3,
#   so its checkpoint is in shards) and an MPT with ALiBi and no biases, each 4 steps from its
#   init: the reader's loss on the first 24 validation samples is anvil eval's to 1e-5 (relative),
#   and its greedy continuation of a prompt is anvil generate's at temperature 0, token for token;
# - anvil eval on the whole split gives the training run's final eval loss;
# - --dtype bf16 and fp16: every tensor is the fp32 export's, rounded to nearest even;
# - --max-shard-size: model-0000i-of-0000N.safetensors and an index naming every tensor once;
# - errors: an existing output directory, a bad --dtype, a model transformers' MPT cannot hold.
# Usage: test_hf_export.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=1
start_test
reader=("/usr/bin/python3" "$src/tests/interop/hf_reference.py")

prepare_brown_news "$anvil" "$src" "$tmp" 64 || { echo "FAIL: data prepare"; exit 1; }
cat > "$tmp/m.yaml" <<YAML
max_seq_len: 64
model: {n_layers: 2, n_heads: 4, d_model: 64, vocab_size: 50257}
train_loader: {name: text, dataset: {local: $tmp/data, split: train}}
eval_loader: {name: text, dataset: {local: $tmp/data, split: val, shuffle: false}}
eval_first: false
optimizer: {name: decoupled_adamw, lr: 1.0e-3, betas: [0.9, 0.95]}
max_duration: 4ba
global_train_batch_size: 8
seed: 3
YAML
# train NAME RANKS OVERRIDES...
train() {
  local name="$1" np="$2"; shift 2
  mpirun_anvil "$np" "$anvil" train "$tmp/m.yaml" run_dir="$tmp/$name" "$@" > "$tmp/$name.out" 2>&1 \
    || { fail "$name: training failed"; tail -5 "$tmp/$name.out"; }
}
train gpt2 1 model.name=gpt2
train llama 2 model.name=llama model.n_kv_heads=2 distributed.zero_stage=3
train mpt 1 model.name=mpt_causal_lm model.no_bias=true model.attn_config.alibi=true

field() { /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.argv[2])[sys.argv[1]])' "$1" "$2"; }
# close JSON_A JSON_B TOL: their losses agree to TOL, relative.
close() {
  /usr/bin/python3 -c 'import json, sys; a, b = (json.loads(x)["loss"] for x in sys.argv[1:3])
sys.exit(0 if abs(a - b) <= float(sys.argv[3]) * abs(b) else 1)' "$1" "$2" "$3" 2>/dev/null
}
# anvil eval over the whole validation split: the run's own final eval loss.
last=$(grep '"eval_loss"' "$tmp/gpt2/metrics.jsonl" | tail -1 | sed 's/.*"eval_loss": *\([0-9.e+-]*\).*/{"loss": \1}/')
whole=$("$anvil" eval "$tmp/gpt2" --data "$tmp/data" --batch 3 2>&1 | tail -1)
close "$whole" "$last" 1e-8 && pass "anvil eval on the whole split: $(field loss "$whole"), the run's final eval loss" \
  || fail "anvil eval '$whole', the run's final eval '$last'"

prompt="The jury said"
ids=$(printf '%s' "$prompt" | "$anvil" tokenize | tr '\n' ' ')
for name in gpt2 llama mpt; do
  out=$("$anvil" export "$tmp/$name" "$tmp/hf-$name" 2>&1) || { fail "$name: export: $out"; continue; }
  theirs=$("${reader[@]}" loss "$tmp/hf-$name" "$tmp/data/val" 24 2>&1) || { fail "$name: the reader: $theirs"; continue; }
  ours=$("$anvil" eval "$tmp/$name" --data "$tmp/data" --max-samples 24 2>&1 | tail -1)
  close "$ours" "$theirs" 1e-5 && pass "$name: eval loss on 24 samples: anvil $(field loss "$ours"), transformers' layout $(field loss "$theirs")" \
    || fail "$name: eval loss: anvil '$ours', the reader '$theirs'"
  cont=$("${reader[@]}" greedy "$tmp/hf-$name" 16 $ids 2>&1) || { fail "$name: the reader: $cont"; continue; }
  theirs=$(printf '%s\n' $ids $cont | "$anvil" tokenize --decode)
  ours=$("$anvil" generate "$tmp/$name" --prompt "$prompt" --max-new-tokens 16 --temperature 0 2>/dev/null)
  [ "$theirs" = "$ours" ] && pass "$name: $(tail -1 <<< "$out"); transformers' greedy continuation is anvil's: '$ours'" \
    || fail "$name: the reader continues '$theirs', anvil generate '$ours'"
done
arch=$(sed -n 's/^ *"model_type": "\(.*\)",/\1/p' "$tmp/hf-llama/config.json")
kv=$(sed -n 's/^ *"num_key_value_heads": \([0-9]*\),/\1/p' "$tmp/hf-llama/config.json")
[ "$arch" = llama ] && [ "$kv" = 2 ] && [ -f "$tmp/hf-llama/vocab.json" ] && [ -f "$tmp/hf-llama/merges.txt" ] \
  && [ -f "$tmp/hf-llama/tokenizer_config.json" ] && [ -f "$tmp/hf-llama/generation_config.json" ] \
  && pass "llama: config.json model_type llama with num_key_value_heads 2, the tokenizer's files" \
  || fail "llama export's files: $(ls "$tmp/hf-llama" | tr '\n' ' ')"

for dtype in bf16 fp16; do
  "$anvil" export "$tmp/llama" "$tmp/hf-llama-$dtype" --dtype "$dtype" > /dev/null 2>&1 \
    && r=$("${reader[@]}" rounded "$tmp/hf-llama" "$tmp/hf-llama-$dtype" 2>&1) \
    && grep -q "\"torch_dtype\": \"$([ $dtype = bf16 ] && echo bfloat16 || echo float16)\"" "$tmp/hf-llama-$dtype/config.json" \
    && pass "--dtype $dtype: $r" || fail "--dtype $dtype: $r"
done
"$anvil" export "$tmp/llama" "$tmp/hf-sharded" --max-shard-size 8mb > /dev/null 2>&1 \
  && r=$("${reader[@]}" index "$tmp/hf-sharded" 2>&1) && [ ! -e "$tmp/hf-sharded/model.safetensors" ] \
  && cont=$("${reader[@]}" greedy "$tmp/hf-sharded" 4 $ids) && [ "$cont" = "$("${reader[@]}" greedy "$tmp/hf-llama" 4 $ids)" ] \
  && pass "--max-shard-size 8mb: $r, the same model" || fail "sharded export: $r"

expect_error "existing output" "already exists" "$anvil" export "$tmp/gpt2" "$tmp/hf-gpt2"
"$anvil" export "$tmp/gpt2" "$tmp/hf-x" --dtype fp8 > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && head -1 "$tmp/err" | grep -q -- "--dtype 'fp8' is not valid: expected fp32, bf16 or fp16" \
  && pass "bad --dtype (usage error, exit 2): $(head -1 "$tmp/err")" || fail "bad --dtype: exit $rc, $(cat "$tmp/err")"
train mpt_learned 1 model.name=mpt_causal_lm max_duration=1ba
expect_error "MPT with learned positions" "cannot be written as transformers' MptForCausalLM: it has positions other than ALiBi" \
  "$anvil" export "$tmp/mpt_learned" "$tmp/hf-x"
[ ! -e "$tmp/hf-x" ] && ! ls -a "$tmp" | grep -q export-tmp && pass "no output directory after a failed export" \
  || fail "a failed export left $(ls -a "$tmp" | tr '\n' ' ')"
[ "$failures" -eq 0 ]
