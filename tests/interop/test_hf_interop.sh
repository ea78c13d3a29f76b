#!/usr/bin/env bash
# anvil export and import, checked by a reader that is not anvil's (tests/interop/hf_reference.py: the
# safetensors format parsed from its definition, the model rebuilt from config.json and
# transformers' tensor names as transformers' modeling files compute it):
# - GPT-2, a Llama with grouped-query heads and its own LM head (trained on 2 ranks under ZeRO-3
#   where mpirun is here, so its checkpoint is in shards) and an MPT with ALiBi and no biases,
#   each 4 steps from its init: the reader's loss on the first 24 validation samples is anvil eval's to 1e-5 (relative),
#   and its greedy continuation of a prompt is anvil generate's at temperature 0, token for token;
# - anvil eval on the whole split gives the training run's final eval loss; eval and generate read
#   a transformers directory as they read a checkpoint; generate's --top-p;
# - --dtype bf16 and fp16: every tensor is the fp32 export's, rounded to nearest even;
# - --max-shard-size: model-0000i-of-0000N.safetensors and an index naming every tensor once;
# - errors: an existing output directory, a bad --dtype, a model transformers' MPT cannot hold;
# - import: export then import gives the checkpoint's weight digest (bit for bit); directories the
#   reader writes as save_pretrained lays them out (GPT-2 under OpenAI's original names with mask
#   buffers, a bf16 Llama in 3 shards with rms_norm_eps 1e-6 and rope_theta 5e5, a tied Llama, an
#   MPT, a Mistral, a Qwen2 with its q/k/v biases, a Qwen3 with its head_dim and per-head q/k
#   norms, a Llama 3.1 with rope_scaling llama3) import
#   with anvil eval's loss equal to the reader's; a Mistral whose sliding window is shorter than
#   the sequences evaluates and generates past it as the reader does; a Mixtral (4 experts, top 2)
#   and a Qwen3-MoE (4 experts, top 2, weights not renormalised) evaluate and generate as the
#   reader does, and their exports, read back by the reader, give the originals' losses; the
#   imported GPT-2 fine-tunes through
#   load_path (weights only, from step 0) and generates; LLM Foundry's hf_causal_lm section naming
#   an exported directory trains from its weights (the eval before training is anvil eval's);
# - generate --chat: the reply to a chat rendered by the directory's own Jinja template is the
#   reader's greedy continuation of `tokenize --chat`'s ids;
# - Llama 3.1's rope_scaling from transformers 5's config.json (rope_parameters) too, and back;
# - import errors: an unknown rope_scaling, Mistral's rope_scaling, a missing tensor, a tensor of
#   the wrong shape, an unexpected tensor, a truncated file, an unknown model_type: one line each,
#   nothing written.
# Usage: test_hf_interop.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=1
start_test
reader=("/usr/bin/python3" "$src/tests/interop/hf_reference.py")

prepare_brown_news "$anvil" "$src" "$tmp" 64 || { echo "FAIL: data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml at 64 tokens, width 64 and 4 heads on GPT-2's whole vocabulary (the
# family set by each run), 4 steps, evaluated on the whole validation split.
m=(variables.data="$tmp/data" variables.tokenizer=gpt2 max_seq_len=64 model.n_heads=4 model.d_model=64
   model.vocab_size=50257 max_duration=4ba eval_subset_num_batches=-1 seed=3)
# Two ranks where mpirun is here (the Llama's checkpoint is then in ZeRO-3 shards).
ranks=1; have_mpirun && ranks=2
# train NAME RANKS OVERRIDES...
train() {
  local name="$1" np="$2"; shift 2
  train_run tiny-gpt2 "$name" "$np" "${m[@]}" "$@" || { fail "$name: training failed"; tail -5 "$tmp/$name.out"; }
}
train gpt2 1 model.name=gpt2
train llama "$ranks" model.name=llama model.n_kv_heads=2 distributed.zero_stage=3
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
# generate --chat: the model continues the chat as the directory's own Jinja template renders it
# with the generation prompt (the reader's greedy continuation of `tokenize --chat`'s ids, which
# are apply_chat_template's), and the reply is what follows, up to EOS.
# A barely trained model (the 4-step ones answer every prompt alike), exported with a template.
train gpt2-fresh 1 model.name=gpt2 max_duration=1ba optimizer.lr=1e-5
"$anvil" export "$tmp/gpt2-fresh" "$tmp/hf-gpt2-chat" > /dev/null 2>&1 || fail "gpt2-fresh: export failed"
/usr/bin/python3 - "$tmp/hf-gpt2-chat/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>\\n' }}"
                      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
json.dump(c, open(sys.argv[1], "w"))
PY
chat='[{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "The jury said"}]'
cids=$(printf '%s' "$chat" | "$anvil" tokenize --chat --add-generation-prompt --tokenizer "$tmp/hf-gpt2-chat" | tr '\n' ' ')
cont=$("${reader[@]}" greedy "$tmp/hf-gpt2-chat" 12 $cids 2>&1)
# (The '.'s keep the newlines a tiny model likes to reply with; generate ends its output with one.)
reply=$(for t in $cont; do [ "$t" = 50256 ] && break; echo "$t"; done | "$anvil" tokenize --decode; printf '\n.')
ours=$("$anvil" generate "$tmp/hf-gpt2-chat" --chat --system "Be brief. " --prompt "The jury said" --max-new-tokens 12 \
       --temperature 0 2>"$tmp/chat.err"; printf .)
[ -n "$cids" ] && [ -n "$cont" ] && [ "$reply" = "$ours" ] && pass "generate --chat: the reply to the chat the template renders is transformers' greedy one: $(printf '%q' "${ours%.}")" \
  || fail "generate --chat: the reader replies '$reply' ($cont), anvil '$ours' $(cat "$tmp/chat.err") (chat ids: $cids)"
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
expect_error "bad --dtype" "--dtype 'fp8' is not valid: expected fp32, bf16 or fp16" \
  "$anvil" export "$tmp/gpt2" "$tmp/hf-x" --dtype fp8
train mpt_learned 1 model.name=mpt_causal_lm max_duration=1ba
expect_error "MPT with learned positions" "cannot be written as transformers' MptForCausalLM: it has positions other than ALiBi" \
  "$anvil" export "$tmp/mpt_learned" "$tmp/hf-x"
[ ! -e "$tmp/hf-x" ] && ! ls -a "$tmp" | grep -q export-tmp && pass "no output directory after a failed export" \
  || fail "a failed export left $(ls -a "$tmp" | tr '\n' ' ')"
# --- import ------------------------------------------------------------------------------------
for name in gpt2 llama mpt; do
  "$anvil" import "$tmp/hf-$name" "$tmp/back-$name" > "$tmp/import.out" 2>&1 || { fail "$name: import: $(cat "$tmp/import.out")"; continue; }
  a=$("$anvil" inspect "$tmp/$name" | sed -n 's/^weights sha256: //p'); b=$("$anvil" inspect "$tmp/back-$name" | sed -n 's/^weights sha256: //p')
  [ -n "$a" ] && [ "$a" = "$b" ] && pass "$name: import(export(x)) has x's weight digest ${a:0:16}..." \
    || fail "$name: round trip digest $b, want $a"
done
imported() {  # imported NAME ARCH [WRITE OPTIONS]: the reader writes it, anvil imports it, both evaluate it
  local name="$1" arch="$2"; shift 2
  "${reader[@]}" write "$arch" "$tmp/w-$name" "$@" > /dev/null || { fail "$name: the reader's write"; return; }
  "$anvil" import "$tmp/w-$name" "$tmp/i-$name" > "$tmp/import-$name.out" 2>&1 \
    || { fail "$name: import: $(cat "$tmp/import-$name.out")"; return; }
  local theirs ours
  theirs=$("${reader[@]}" loss "$tmp/w-$name" "$tmp/data/val" 16 2>&1)
  ours=$("$anvil" eval "$tmp/i-$name" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)
  close "$ours" "$theirs" 1e-5 \
    && pass "import $name: $(head -1 "$tmp/import-$name.out" | sed 's/ -> .*//'); eval loss $(field loss "$ours") = the reader's" \
    || fail "import $name: anvil '$ours', the reader '$theirs'"
}
# round_trips NAME: the import i-NAME exported (hf-NAME) and imported again (back-NAME) keeps its
# weight digest.
digest_of() { "$anvil" inspect "$1" 2>/dev/null | sed -n 's/^weights sha256: //p'; }
round_trips() {
  "$anvil" export "$tmp/i-$1" "$tmp/hf-$1" > /dev/null 2>&1 && "$anvil" import "$tmp/hf-$1" "$tmp/back-$1" > /dev/null 2>&1 \
    && [ -n "$(digest_of "$tmp/i-$1")" ] && [ "$(digest_of "$tmp/i-$1")" = "$(digest_of "$tmp/back-$1")" ]
}
imported gpt2-original gpt2 --gpt2-original-names
# anvil eval and generate read a transformers directory as they read a checkpoint.
direct=$("$anvil" eval "$tmp/hf-llama" --data "$tmp/data" --max-samples 24 2>&1 | tail -1)
via=$("$anvil" eval "$tmp/llama" --data "$tmp/data" --max-samples 24 2>&1 | tail -1)
[ "$direct" = "$via" ] && pass "anvil eval of the Llama's transformers directory: $(field loss "$direct"), its checkpoint's" \
  || fail "eval of the directory '$direct', of the checkpoint '$via'"
g1=$("$anvil" generate "$tmp/hf-llama" --prompt "$prompt" --max-new-tokens 8 --temperature 0 2>> "$tmp/gen.err")
g2=$("$anvil" generate "$tmp/llama" --prompt "$prompt" --max-new-tokens 8 --temperature 0 2>> "$tmp/gen.err")
# top-p below the top token's probability keeps only it: sampling at temperature 1 is then greedy.
g3=$("$anvil" generate "$tmp/hf-llama" --prompt "$prompt" --max-new-tokens 8 --temperature 1 --top-p 1e-9 --seed 5 2>> "$tmp/gen.err")
[ "$g1" = "$g2" ] && [ "$g1" = "$g3" ] && pass "anvil generate of the directory: '$g1', as from the checkpoint; --top-p 1e-9 samples it too" \
  || { fail "generate: directory '$g1', checkpoint '$g2', top-p '$g3'"; cat "$tmp/gen.err"; }
imported llama-bf16 llama --dtype bf16 --shards 3
imported llama-tied llama-tied
imported mpt mpt --dtype fp16
imported mistral mistral
# Mistral's sliding window: kept through export, and applied in attention.
round_trips mistral \
  && grep -q '"model_type": "mistral"' "$tmp/hf-mistral/config.json" \
  && grep -q '"sliding_window": 64' "$tmp/hf-mistral/config.json" \
  && pass "mistral: import(export(x)) has x's weight digest, config.json keeps model_type mistral and sliding_window 64" \
  || fail "mistral: export round trip: $(cat "$tmp/hf-mistral/config.json" 2>&1 | head -5)"
cp -r "$tmp/w-mistral" "$tmp/w-mistral-short"
sed -i 's/"sliding_window": 64/"sliding_window": 16/' "$tmp/w-mistral-short/config.json"
# A window of 16 keys in sequences of 64: anvil's loss is the reader's (which masks as transformers
# does), and not the loss without the window (the window is not ignored); greedy generation well
# past the window continues as the reader's does.
theirs=$("${reader[@]}" loss "$tmp/w-mistral-short" "$tmp/data/val" 16 2>&1)
ours=$("$anvil" eval "$tmp/w-mistral-short" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)
whole=$("$anvil" eval "$tmp/w-mistral" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)
close "$ours" "$theirs" 1e-5 && ! close "$ours" "$whole" 1e-6 \
  && pass "mistral: a window of 16 in 64-token sequences: eval loss $(field loss "$ours") = the reader's (without the window: $(field loss "$whole"))" \
  || fail "mistral window 16: anvil '$ours', the reader '$theirs', window 64 '$whole'"
cont=$("${reader[@]}" greedy "$tmp/w-mistral-short" 30 $ids 2>&1)
theirs=$(printf '%s\n' $ids $cont | "$anvil" tokenize --decode)
ours=$("$anvil" generate "$tmp/w-mistral-short" --prompt "$prompt" --max-new-tokens 30 --temperature 0 2>/dev/null)
[ "$theirs" = "$ours" ] && pass "mistral: 30 tokens greedily past a window of 16, as the reader: '$ours'" \
  || fail "mistral window 16: the reader continues '$theirs', anvil generate '$ours'"
# sparse NAME FIELD...: a mixture of experts the reader wrote as NAME: the import's loss is the
# reader's (imported), and so are 12 greedy tokens; the export keeps config.json's model_type and
# each FIELD (a '"key": value' text), and the reader, reading the export's per-expert tensors, gets
# the same loss as from the original.
sparse() {
  local name="$1"; shift
  imported "$name" "$name"
  local cont theirs ours field kept=1 trip=0
  cont=$("${reader[@]}" greedy "$tmp/w-$name" 12 $ids 2>&1)
  theirs=$(printf '%s\n' $ids $cont | "$anvil" tokenize --decode)
  ours=$("$anvil" generate "$tmp/i-$name" --prompt "$prompt" --max-new-tokens 12 --temperature 0 2>/dev/null)
  [ "$theirs" = "$ours" ] && pass "$name: 12 tokens greedily, as the reader: '$ours'" \
    || fail "$name: the reader continues '$theirs', anvil generate '$ours'"
  round_trips "$name" && trip=1  # writes the export hf-NAME
  for field in "\"model_type\": \"$name\"" "$@"; do
    grep -q "$field" "$tmp/hf-$name/config.json" 2>/dev/null || kept=0
  done
  [ "$trip" = 1 ] && [ "$kept" = 1 ] \
    && [ "$("${reader[@]}" loss "$tmp/hf-$name" "$tmp/data/val" 16 2>&1)" = \
         "$("${reader[@]}" loss "$tmp/w-$name" "$tmp/data/val" 16 2>&1)" ] \
    && pass "$name: import(export(x)) has x's digest, config.json keeps the experts, the reader's loss of the export" \
    || fail "$name: export round trip: $(head -c 400 "$tmp/hf-$name/config.json" 2>&1)"
}
# Mixtral: each MLP a sparse block of 4 experts, top 2, their weights renormalised.
sparse mixtral '"num_local_experts": 4' '"num_experts_per_tok": 2'
# Qwen3-MoE: Qwen3's heads (head_dim wider than hidden_size / heads, per-head q/k norms) with each
# MLP a sparse block of 4 experts, top 2, their probabilities as weights (norm_topk_prob false).
sparse qwen3_moe '"num_experts": 4' '"num_experts_per_tok": 2' '"norm_topk_prob": false'
# Llama 3.1's rope_scaling (rope_type llama3) as transformers 4 writes it, and as transformers 5
# does (rope_parameters holding rope_theta; dtype for torch_dtype): the reader's loss, the same
# weights from both, and config.json's rope_scaling kept through export. The scaling matters here:
# without it the reader's loss is another.
imported llama31 llama31
/usr/bin/python3 - "$tmp/w-llama31" "$tmp/w-llama31-v5" <<'PY'
import json, os, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
path = os.path.join(sys.argv[2], "config.json")
cfg = json.load(open(path))
cfg["rope_parameters"] = dict(cfg.pop("rope_scaling"), rope_theta=cfg.pop("rope_theta"))
cfg["dtype"] = "float32"
json.dump(cfg, open(path, "w"), indent=2)
PY
"$anvil" import "$tmp/w-llama31-v5" "$tmp/i-llama31-v5" > /dev/null 2>&1 \
  && [ -n "$(digest_of "$tmp/i-llama31")" ] && [ "$(digest_of "$tmp/i-llama31")" = "$(digest_of "$tmp/i-llama31-v5")" ] \
  && [ "$("$anvil" eval "$tmp/i-llama31-v5" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)" = \
       "$("$anvil" eval "$tmp/i-llama31" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)" ] \
  && pass "llama31: transformers 5's rope_parameters import as transformers 4's rope_scaling (same weights, same eval)" \
  || fail "llama31: transformers 5's layout"
round_trips llama31 \
  && /usr/bin/python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["rope_scaling"]
sys.exit(0 if s == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64} else 1)' "$tmp/hf-llama31/config.json" \
  && pass "llama31: export writes rope_scaling as transformers 4 does; import(export(x)) has x's digest" \
  || fail "llama31: export: $(grep -A6 rope_scaling "$tmp/hf-llama31/config.json")"
cp -r "$tmp/w-llama31" "$tmp/w-llama31-unscaled"
sed -i 's/"rope_type": "llama3"/"rope_type": "default"/' "$tmp/w-llama31-unscaled/config.json"
unscaled=$("${reader[@]}" loss "$tmp/w-llama31-unscaled" "$tmp/data/val" 16 2>&1)
scaled=$("$anvil" eval "$tmp/i-llama31" --data "$tmp/data" --max-samples 16 2>&1 | tail -1)
! close "$scaled" "$unscaled" 1e-4 && pass "llama31: the scaling changes the loss ($(field loss "$scaled") scaled, $(field loss "$unscaled") not)" \
  || fail "llama31: the scaled loss '$scaled' is the unscaled '$unscaled': the test cannot tell"

# Qwen2: biases on q, k and v alone, kept through export; use_sliding_window is refused.
imported qwen2 qwen2
round_trips qwen2 \
  && grep -q '"model_type": "qwen2"' "$tmp/hf-qwen2/config.json" \
  && grep -q '"use_sliding_window": false' "$tmp/hf-qwen2/config.json" \
  && "${reader[@]}" loss "$tmp/hf-qwen2" "$tmp/data/val" 4 > /dev/null 2>&1 \
  && pass "qwen2: import(export(x)) has x's weight digest; config.json keeps model_type qwen2, use_sliding_window false" \
  || fail "qwen2: export round trip: $(head -5 "$tmp/hf-qwen2/config.json" 2>&1)"
# Qwen3: heads of 32 over a width of 64 (queries 128 wide), a norm over each head's queries and keys.
imported qwen3 qwen3
round_trips qwen3 \
  && grep -q '"model_type": "qwen3"' "$tmp/hf-qwen3/config.json" && grep -q '"head_dim": 32' "$tmp/hf-qwen3/config.json" \
  && pass "qwen3: import(export(x)) has x's weight digest; config.json keeps model_type qwen3 and head_dim 32" \
  || fail "qwen3: export round trip: $(head -5 "$tmp/hf-qwen3/config.json" 2>&1)"
cp -r "$tmp/w-qwen2" "$tmp/w-qwen2-window"
sed -i 's/"use_sliding_window": false/"use_sliding_window": true/' "$tmp/w-qwen2-window/config.json"
expect_error "Qwen2's use_sliding_window" "field 'use_sliding_window' = true cannot be honoured" \
  "$anvil" import "$tmp/w-qwen2-window" "$tmp/x"
grep -q "(2 buffers skipped)" "$tmp/import-gpt2-original.out" \
  && pass "GPT-2's original names: the attn.bias buffers are skipped" || fail "GPT-2's original names: buffers not reported"
# Fine-tuning the imported GPT-2: the config describes the same model; weights only, from step 0.
if train_run tiny-gpt2 tuned 1 "${m[@]}" model.name=gpt2 load_path="$tmp/i-gpt2-original" max_duration=3ba \
   && grep -q "loaded the weights of .*step-00000000 (weights only" "$tmp/tuned.out" \
   && [ "$(grep -c '"loss"' "$tmp/tuned/metrics.jsonl")" -eq 3 ] \
   && "$anvil" generate "$tmp/tuned" --prompt "$prompt" --max-new-tokens 4 > /dev/null 2>&1; then
  pass "the imported GPT-2 fine-tunes from step 0 (weights only) and generates"
else
  fail "fine-tuning the import: $(tail -3 "$tmp/tuned.out")"
fi

# LLM Foundry's hf_causal_lm section names the exported Llama directory: its architecture, its
# pretrained weights (weights only; on 2 ranks where mpirun is here) and its tokenizer. The eval before training is
# anvil eval's of the directory.
cat > "$tmp/foundry-hf.yaml" <<YAML
variables:
  model_dir: $tmp/hf-llama
max_seq_len: 64
model:
  name: hf_causal_lm
  pretrained_model_name_or_path: \${variables.model_dir}
  pretrained: true
  init_device: mixed
  use_flash_attention_2: false
  config_overrides: {attention_dropout: 0.0}
tokenizer:
  name: \${variables.model_dir}
  kwargs: {model_max_length: 64}
train_loader: {name: text, dataset: {local: $tmp/data, split: train}}
eval_loader: {name: text, dataset: {local: $tmp/data, split: val, shuffle: false}}
eval_first: true
optimizer: {name: decoupled_adamw, lr: 1.0e-4, betas: [0.9, 0.95]}
max_duration: 2ba
global_train_batch_size: 8
YAML
first=""
if mpirun_anvil "$ranks" "$anvil" train "$tmp/foundry-hf.yaml" run_dir="$tmp/foundry-hf" > "$tmp/foundry-hf.out" 2>&1; then
  first=$(grep '"eval_loss"' "$tmp/foundry-hf/metrics.jsonl" | head -1 | sed 's/.*"eval_loss": *\([0-9.e+-]*\).*/{"loss": \1}/')
fi
direct=$("$anvil" eval "$tmp/hf-llama" --data "$tmp/data" 2>&1 | tail -1)
[ -n "$first" ] && close "$first" "$direct" 1e-8 && grep -q "loaded the weights of $tmp/hf-llama (weights only" "$tmp/foundry-hf.out" \
  && pass "Foundry's hf_causal_lm trains from the directory's weights: eval before training $(field loss "$first"), anvil eval's" \
  || fail "hf_causal_lm: first eval '$first', anvil eval '$direct': $(tail -3 "$tmp/foundry-hf.out")"

# Import errors: one line, nothing written.
"${reader[@]}" write llama "$tmp/bad-rope" > /dev/null
sed -i 's/"rope_scaling": null/"rope_scaling": {"type": "dynamic", "factor": 2.0}/' "$tmp/bad-rope/config.json"
expect_error "rope_scaling dynamic" "(field 'rope_scaling'): model.rope_scaling.type 'dynamic' is not valid: expected default, linear or llama3" \
  "$anvil" import "$tmp/bad-rope" "$tmp/x"
cp -r "$tmp/w-mistral" "$tmp/bad-mistral-rope"
sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "linear", "factor": 2.0}/' "$tmp/bad-mistral-rope/config.json"
expect_error "Mistral's rope_scaling" "field 'rope_scaling' = .* cannot be honoured" \
  "$anvil" import "$tmp/bad-mistral-rope" "$tmp/x"
cp -r "$tmp/hf-gpt2" "$tmp/bad-type"; sed -i 's/"model_type": "gpt2"/"model_type": "bloom"/' "$tmp/bad-type/config.json"
expect_error "unknown model_type" "model_type 'bloom' is not one anvil can import" "$anvil" import "$tmp/bad-type" "$tmp/x"
cp -r "$tmp/hf-gpt2" "$tmp/bad-layers"; sed -i 's/"n_layer": 2/"n_layer": 3/' "$tmp/bad-layers/config.json"
expect_error "missing tensor" "has no tensor 'transformer.h.2.ln_1.weight'" "$anvil" import "$tmp/bad-layers" "$tmp/x"
cp -r "$tmp/hf-gpt2" "$tmp/bad-width"; sed -i 's/"n_inner": 256/"n_inner": 512/' "$tmp/bad-width/config.json"
expect_error "n_inner" "field 'n_inner' = 512 cannot be honoured" "$anvil" import "$tmp/bad-width" "$tmp/x"
cp -r "$tmp/hf-gpt2" "$tmp/bad-shape"; sed -i 's/"n_positions": 64/"n_positions": 32/; s/"n_ctx": 64/"n_ctx": 32/' "$tmp/bad-shape/config.json"
expect_error "wrong shape" "tensor 'transformer.wpe.weight' in 'model.safetensors' has shape \[64, 64\], but config.json's model needs \[32, 64\]" \
  "$anvil" import "$tmp/bad-shape" "$tmp/x"
cp -r "$tmp/hf-llama" "$tmp/bad-extra"; sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$tmp/bad-extra/config.json"
expect_error "lm_head beside a tied config" "stores lm_head.weight unlike the embedding" "$anvil" import "$tmp/bad-extra" "$tmp/x"
cp -r "$tmp/hf-gpt2" "$tmp/bad-trunc"; truncate -s 100000 "$tmp/bad-trunc/model.safetensors"
expect_error "truncated file" "model.safetensors" "$anvil" import "$tmp/bad-trunc" "$tmp/x"
[ ! -e "$tmp/x" ] && pass "no run directory after a failed import" || fail "a failed import left $tmp/x"
[ "$failures" -eq 0 ]
