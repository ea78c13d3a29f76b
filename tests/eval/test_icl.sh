#!/usr/bin/env bash
# `anvil eval --icl`: LLM Foundry's in-context-learning tasks (multiple_choice, schema,
# language_modeling, generation_task_with_answers with and without a chain of thought, a task with
# categories, few-shot examples, contexts cut to a task's max_seq_len) written from the Brown
# corpus (make_icl_tasks.py) and scored on a small GPT-2 that
# anvil trains; the accuracies equal, task by task, those of an independent scorer
# (icl_reference.py: Python's random and set, gpt-3-encoder, PyTorch on the exported model), and
# so do the eval gauntlet's category and average scores. LLM Foundry's published task and gauntlet
# files are read as published. And what a task file gets wrong is a one-line error naming it.
# Usage: test_icl.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test
prepare_brown_news "$anvil" "$src" "$tmp" 64
train_run tiny-gpt2 run 1 variables.data="$tmp/data" variables.tokenizer=gpt2 model.vocab_size=50257 \
  max_seq_len=64 max_duration=120ba optimizer.lr=1.0e-2 || { cat "$tmp/run.out"; exit 1; }
"$anvil" export "$tmp/run" "$tmp/hf" > /dev/null 2>&1 || fail "export"
/usr/bin/python3 "$src/tests/eval/make_icl_tasks.py" "$tmp/brown" "$tmp/tasks"
"$anvil" eval "$tmp/run" --icl "$tmp/tasks/tasks.yaml" --gauntlet "$tmp/tasks/gauntlet.yaml" --json \
  > "$tmp/anvil.jsonl" 2> "$tmp/eval.err" || { fail "anvil eval --icl"; cat "$tmp/eval.err"; }
grep -q "gauntlet: left out category unevaluated: brown_mc/1-shot was not evaluated" "$tmp/eval.err" &&
  pass "a gauntlet category with a benchmark not evaluated is left out, and said" ||
  fail "the left-out gauntlet category is not on stderr: $(cat "$tmp/eval.err")"
/usr/bin/python3 "$src/tests/eval/icl_reference.py" "$tmp/hf" "$tmp/tasks/tasks.yaml" "$src/.deps/npm/node_modules" \
  "$tmp/tasks/gauntlet.yaml" > "$tmp/reference.jsonl" || fail "the reference scorer"
/usr/bin/python3 - "$tmp/anvil.jsonl" "$tmp/reference.jsonl" <<'PY' && pass "every task's accuracy equals the reference's" || fail "accuracies differ from the reference's"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ref_lines = [json.loads(l) for l in open(sys.argv[2])]
ours = [o for o in lines if "task" in o]
ref = {r["task"]: r for r in ref_lines if "task" in r}
assert len(ours) == len(ref) and len(ours) >= 20, (len(ours), len(ref))
gauntlet = [(o["gauntlet"], round(o["score"], 8)) for o in lines if "gauntlet" in o]
assert gauntlet == [(r["gauntlet"], round(r["score"], 8)) for r in ref_lines if "gauntlet" in r], gauntlet
assert [g for g, _ in gauntlet] == ["sentences", "words", "core_average", "nothing_average"], gauntlet
print("  gauntlet:", gauntlet)
seen = set()
for o in ours:
    r = ref[o["task"]]
    assert o["n"] == r["n"] and abs(o["accuracy"] - r["accuracy"]) < 1e-8, (o, r)
    seen.add(o["metric"])
    print(f'  {o["task"]}: {o["accuracy"]:.4f} of {o["n"]}')
# The test can tell rules apart only where scores vary: some right and some wrong answers.
for task in ("brown_lm/", "brown_gen/", "brown_gen_exact/", "brown_gen_cot/"):
    scored = [o for o in ours if o["task"].startswith(task)]
    assert any(0 < o["accuracy"] < 1 for o in scored), scored
assert seen == {"InContextLearningMultipleChoiceAccuracy", "InContextLearningLMAccuracy",
                "InContextLearningGenerationExactMatchAccuracy"}, seen
PY

# icl_tasks and eval_gauntlet in a training YAML, as Foundry's train.py takes them (a file's path or
# the list / section inline): evaluated at each eval_interval and after the last step, each rank
# scoring its share, logged to metrics.jsonl under Foundry's names; the final evaluation equals
# `anvil eval --icl` on the run's checkpoint, and two ranks under ZeRO-3 (every rank's forward
# passes in lockstep) or as two pipeline stages log the same numbers as one. The tasks here skip
# the slow generation ones but for brown_gen's 0-shot.
sed -n '1,/label: brown_gen$/p' "$tmp/tasks/tasks.yaml" | head -n -2 > "$tmp/tasks/train_tasks.yaml"
printf -- '-\n  label: brown_gen\n  dataset_uri: %s\n  num_fewshot: [0]\n  icl_task_type: generation_task_with_answers\n  early_stopping_criteria: ["\\n\\n", "[.!?]"]\n' \
  "$tmp/tasks/gen.jsonl" >> "$tmp/tasks/train_tasks.yaml"
icl_train=(variables.data="$tmp/data" variables.tokenizer=gpt2 model.vocab_size=50257 max_seq_len=64
           load_path="$tmp/run" load_weights_only=true max_duration=2ba eval_interval=1ba eval_loader=null)
train_run tiny-gpt2 icl1 1 "${icl_train[@]}" icl_tasks="$tmp/tasks/train_tasks.yaml" \
  eval_gauntlet="$tmp/tasks/gauntlet.yaml" || { fail "training with icl_tasks"; tail -5 "$tmp/icl1.out"; }
"$anvil" eval "$tmp/icl1" --icl "$tmp/tasks/train_tasks.yaml" --gauntlet "$tmp/tasks/gauntlet.yaml" --json \
  > "$tmp/icl1.eval.jsonl" 2> /dev/null || fail "anvil eval --icl on the run"
icl_rows() {  # RUN_DIR: the metrics rows that hold ICL metrics, one JSON object per line, keys sorted
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if any(k.startswith(("metrics/", "icl/")) for k in row):
        print(json.dumps(row, sort_keys=True))' "$1/metrics.jsonl"
}
icl_rows "$tmp/icl1" > "$tmp/icl1.rows"
/usr/bin/python3 - "$tmp/icl1.rows" "$tmp/icl1.eval.jsonl" <<'PY' && pass "icl_tasks in training: logged at each evaluation under Foundry's names, the last equal to anvil eval --icl" || fail "training's ICL metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2], [r["step"] for r in rows]
final = rows[-1]
evals = [json.loads(l) for l in open(sys.argv[2])]
tasks = [e["task"] for e in evals if "task" in e]
expected = {}
for e in evals:
    if "gauntlet" in e:
        expected[f'icl/metrics/eval_gauntlet/{e["gauntlet"]}'] = e["score"]
    elif not any(t.startswith(e["task"] + "/") for t in tasks):  # not a mean of categories
        expected[f'metrics/{e["task"]}/{e["metric"]}'] = e["accuracy"]
got = {k: v for k, v in final.items() if k.startswith(("metrics/", "icl/"))}
assert set(got) == set(expected), sorted(set(got) ^ set(expected))
for k, v in expected.items():
    assert abs(got[k] - v) < 1e-8, (k, got[k], v)
assert "metrics/brown_genres/2-shot/genre_a/InContextLearningMultipleChoiceAccuracy" in got, sorted(got)
assert "icl/metrics/eval_gauntlet/core_average" in got, sorted(got)
print(f"  {len(got)} metrics at step 2, e.g. brown_mc/3-shot {got['metrics/brown_mc/3-shot/InContextLearningMultipleChoiceAccuracy']:.4f}")
PY
if have_mpirun; then
  # The same tasks inline, as a training YAML may give them, on two ranks under ZeRO-3.
  cat "$src/tests/configs/tiny-gpt2.yaml" "$tmp/tasks/train_tasks.yaml" "$tmp/tasks/gauntlet.yaml" > "$tmp/icl-inline.yaml"
  mpirun_anvil 2 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl2" "${icl_train[@]}" distributed.zero_stage=3 \
    > "$tmp/icl2.out" 2>&1 || { fail "training with inline icl_tasks on 2 ranks"; tail -5 "$tmp/icl2.out"; }
  icl_rows "$tmp/icl2" > "$tmp/icl2.rows"
  cmp -s "$tmp/icl1.rows" "$tmp/icl2.rows" && pass "two ranks under ZeRO-3, the tasks inline: the same ICL metrics as one rank" ||
    fail "ICL metrics differ between 1 and 2 ranks: $(diff "$tmp/icl1.rows" "$tmp/icl2.rows" | head -4)"
  # Two pipeline stages: each rank gathers the whole model to score its share of the questions.
  mpirun_anvil 2 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl_pp" "${icl_train[@]}" \
    distributed.pipeline_parallel=2 > "$tmp/icl_pp.out" 2>&1 ||
    { fail "training with icl_tasks as 2 pipeline stages"; tail -5 "$tmp/icl_pp.out"; }
  icl_rows "$tmp/icl_pp" > "$tmp/icl_pp.rows"
  cmp -s "$tmp/icl1.rows" "$tmp/icl_pp.rows" && pass "two pipeline stages: the same ICL metrics as one rank" ||
    fail "ICL metrics differ between one rank and two pipeline stages: $(diff "$tmp/icl1.rows" "$tmp/icl_pp.rows" |
      head -4)"
  # A mixture of experts, its 4 experts shared by 2 ranks (expert parallelism): every pass of the
  # evaluation exchanges rows between the two, in lockstep, and the metrics are one rank's. The
  # ranks batch other questions together than one rank does; an expert's capacity counts from
  # max_seq_len, not the batch's padded length, so that changes no question's routing.
  icl_moe=(variables.data="$tmp/data" variables.tokenizer=gpt2 model.vocab_size=50257 max_seq_len=64 max_duration=2ba
           eval_interval=1ba eval_loader=null model.name=mpt_causal_lm model.no_bias=true model.attn_config.alibi=true
           model.ffn_config.ffn_type=mb_moe model.ffn_config.moe_num_experts=4 model.ffn_config.moe_top_k=2)
  mpirun_anvil 1 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl_moe1" "${icl_moe[@]}" > "$tmp/icl_moe1.out" \
    2>&1 || { fail "training a mixture of experts with icl_tasks"; tail -5 "$tmp/icl_moe1.out"; }
  mpirun_anvil 2 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl_moe2" "${icl_moe[@]}" \
    distributed.expert_parallel=2 > "$tmp/icl_moe2.out" 2>&1 ||
    { fail "training a mixture of experts with icl_tasks on 2 ranks sharing the experts"; tail -5 "$tmp/icl_moe2.out"; }
  icl_rows "$tmp/icl_moe1" > "$tmp/icl_moe1.rows"
  icl_rows "$tmp/icl_moe2" > "$tmp/icl_moe2.rows"
  [ -s "$tmp/icl_moe1.rows" ] && cmp -s "$tmp/icl_moe1.rows" "$tmp/icl_moe2.rows" &&
    pass "a mixture of experts on 2 ranks sharing the experts: the same ICL metrics as one rank" ||
    fail "a mixture of experts' ICL metrics differ between 1 rank and 2 sharing the experts: $(diff \
      "$tmp/icl_moe1.rows" "$tmp/icl_moe2.rows" | head -4)"
  # Tensor parallelism: 2 ranks share each block of a GPT-2 of 2 heads of 256, their shares'
  # parameters sharded further under ZeRO-3 (here over one data-parallel rank); each gathers the
  # whole model to score its share of the questions.
  icl_tp=(variables.data="$tmp/data" variables.tokenizer=gpt2 model.vocab_size=50257 max_seq_len=64 max_duration=1ba
          eval_interval=1ba eval_loader=null model.n_layers=2 model.d_model=512 model.n_heads=2)
  mpirun_anvil 1 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl_tp1" "${icl_tp[@]}" > "$tmp/icl_tp1.out" \
    2>&1 || { fail "training the wide GPT-2 with icl_tasks"; tail -5 "$tmp/icl_tp1.out"; }
  mpirun_anvil 2 "$anvil" train "$tmp/icl-inline.yaml" run_dir="$tmp/icl_tp2" "${icl_tp[@]}" \
    distributed.tensor_parallel=2 distributed.zero_stage=3 > "$tmp/icl_tp2.out" 2>&1 ||
    { fail "training with icl_tasks on 2 ranks sharing each block"; tail -5 "$tmp/icl_tp2.out"; }
  icl_rows "$tmp/icl_tp1" > "$tmp/icl_tp1.rows"
  icl_rows "$tmp/icl_tp2" > "$tmp/icl_tp2.rows"
  [ -s "$tmp/icl_tp1.rows" ] && cmp -s "$tmp/icl_tp1.rows" "$tmp/icl_tp2.rows" &&
    pass "tensor parallelism over 2 ranks: the same ICL metrics as one rank" ||
    fail "ICL metrics differ between 1 rank and 2 sharing each block: $(diff "$tmp/icl_tp1.rows" \
      "$tmp/icl_tp2.rows" | head -4)"
else
  skip "ICL evaluation on two ranks (no mpirun)"
fi
# icl_subset_num_batches: a task without categories cut to its first batches of
# device_eval_batch_size questions; one with categories whole, as in Foundry.
train_run tiny-gpt2 icl_subset 1 "${icl_train[@]}" max_duration=1ba icl_tasks="$tmp/tasks/train_tasks.yaml" \
  icl_subset_num_batches=2 device_eval_batch_size=3 || fail "training with icl_subset_num_batches"
/usr/bin/python3 - "$tmp/icl_subset/train.log" "$tmp/tasks/mc_categories.jsonl" <<'PY' && pass "icl_subset_num_batches cuts tasks without categories to N batches, not those with" || fail "icl_subset_num_batches"
import collections, json, re, sys
counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"icl (\S+) [0-9.]+ \((\d+) questions\)", open(sys.argv[1]).read())}
genres = collections.Counter(json.loads(l)["category"] for l in open(sys.argv[2]))
assert counts["brown_mc/0-shot"] == 6 and counts["brown_lm/5-shot"] == 6 and counts["brown_gen/0-shot"] == 6, counts
for genre, n in genres.items():
    assert counts[f"brown_genres/2-shot/{genre}"] == n, (genre, n, counts)
PY
expect_error "icl_seq_len longer than max_seq_len" "icl_seq_len 128 is longer than max_seq_len 64" \
  "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" run_dir="$tmp/bad_icl" "${icl_train[@]}" \
  icl_tasks="$tmp/tasks/train_tasks.yaml" icl_seq_len=128
expect_error "icl_subset_num_batches without icl_tasks" "icl_seq_len and icl_subset_num_batches shape the icl_tasks: give icl_tasks too" \
  "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" run_dir="$tmp/bad_icl" "${icl_train[@]}" icl_subset_num_batches=2
expect_error "eval_gauntlet without icl_tasks" "eval_gauntlet scores the icl_tasks: give icl_tasks too" \
  "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" run_dir="$tmp/bad_icl" "${icl_train[@]}" \
  eval_gauntlet="$tmp/tasks/gauntlet.yaml"

# LLM Foundry's files as published: its gauntlet reads (none of its benchmarks were run here:
# every category is left out, and core_average is 0, as Foundry gives it); its light task list
# reads up to its data (Foundry's relative paths, from Foundry's scripts/ directory); so does
# v0.3's, whose first task is a generation task.
published="$src/tests/config/published/llm-foundry"
"$anvil" eval "$tmp/run" --icl "$tmp/tasks/tasks.yaml" --gauntlet "$published/eval_gauntlet_v0.3.yaml" --json \
  > "$tmp/published.jsonl" 2> "$tmp/published.err"
[ "$(grep -c 'left out category' "$tmp/published.err")" = 5 ] && grep -q '{"gauntlet": "core_average", "score": 0}' "$tmp/published.jsonl" &&
  pass "LLM Foundry's eval_gauntlet_v0.3.yaml reads as published" || fail "eval_gauntlet_v0.3.yaml: $(tail -2 "$tmp/published.err")"
expect_error "LLM Foundry's tasks_light.yaml reads up to its data" \
  "cannot read the task file 'eval/local_data/world_knowledge/jeopardy_all.jsonl'" "$anvil" eval "$tmp/run" --icl "$published/tasks_light.yaml"
expect_error "LLM Foundry's tasks_v0.3.yaml reads up to its data" \
  "cannot read the task file 'eval/local_data/symbolic_problem_solving/gsm8k_prepended_8shot.jsonl'" \
  "$anvil" eval "$tmp/run" --icl "$published/tasks_v0.3.yaml"

bad="$tmp/bad.yaml"
task_error() {  # NAME PATTERN YAML
  printf '%s\n' "$3" > "$bad"
  expect_error "$1" "$2" "$anvil" eval "$tmp/run" --icl "$bad"
}
task_error "an unknown task key" "continuation_delimeter" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/mc.jsonl, num_fewshot: [0], icl_task_type: multiple_choice, continuation_delimeter: ' '}]"
task_error "a Foundry key anvil does not honour" "context_key is LLM Foundry's key, not honoured by anvil yet" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/mc.jsonl, num_fewshot: [0], icl_task_type: multiple_choice, context_key: q}]"
task_error "num_fewshot not a list" "num_fewshot must be a list" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/mc.jsonl, num_fewshot: 3, icl_task_type: multiple_choice}]"
task_error "an unknown task type" "icl_task_type 'question_answering' is not one of" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/mc.jsonl, num_fewshot: [0], icl_task_type: question_answering}]"
task_error "a generation task's key on another task" "cot_delimiter is a key of generation_task_with_answers tasks, not of multiple_choice ones" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/mc.jsonl, num_fewshot: [0], icl_task_type: multiple_choice, cot_delimiter: x}]"
printf '{"context": "Q: 2 + 3?", "answer": "five hundred and five thousand"}\n' > "$tmp/gen.jsonl"
printf 'icl_tasks: [{label: t, dataset_uri: %s, num_fewshot: [0], icl_task_type: generation_task_with_answers, max_seq_len: 5}]\n' \
  "$tmp/gen.jsonl" > "$bad"
expect_failure "answers as long as a task's sequence" "answers of up to 5 tokens leave no room for a prompt in max_seq_len 5" \
  "$anvil" eval "$tmp/run" --icl "$bad"
task_error "a stop string that is no regular expression" "early_stopping_criteria: '(' is not a regular expression" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers, early_stopping_criteria: ['(']}]"
task_error "sampling in generation_kwargs" "generation_kwargs: anvil's ICL evaluation decodes greedily (do_sample: false, num_beams: 1)" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers, generation_kwargs: {do_sample: true}}]"
task_error "a temperature in generation_kwargs" "generation_kwargs.temperature: anvil's ICL evaluation decodes greedily" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers, generation_kwargs: {temperature: 0.7}}]"
task_error "an unknown key in generation_kwargs" "generation_kwargs.max_length' (expected one of: do_sample, eos_token_id" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers, generation_kwargs: {max_length: 9}}]"
task_error "an EOS id that is no id" "generation_kwargs.eos_token_id must be a token id or a list of them" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/gen.jsonl, num_fewshot: [0], icl_task_type: generation_task_with_answers, generation_kwargs: {eos_token_id: [x]}}]"
printf 'icl_tasks: [{label: t, dataset_uri: %s, num_fewshot: [0], icl_task_type: generation_task_with_answers, generation_kwargs: {eos_token_id: 60000}}]\n' \
  "$tmp/gen.jsonl" > "$bad"
expect_failure "an EOS id outside the vocabulary" "generation_kwargs.eos_token_id 60000 is outside the model's vocab_size 50257" \
  "$anvil" eval "$tmp/run" --icl "$bad"
task_error "a missing data file" "cannot read the task file '$tmp/none.jsonl'" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/none.jsonl, num_fewshot: [0], icl_task_type: schema}]"
task_error "a file of the wrong type" "no \"query\"" \
  "icl_tasks: [{label: t, dataset_uri: $tmp/tasks/lm.jsonl, num_fewshot: [0], icl_task_type: multiple_choice}]"
task_error "no icl_tasks" "has no icl_tasks list" "tasks: []"
printf 'eval_gauntlet: {weighting: MEAN, categories: [{name: c, benchmarks: [{name: brown_mc, num_fewshot: 0, random_baseline: 0.25}]}]}\n' > "$tmp/g.yaml"
expect_error "a gauntlet's unknown weighting" "eval_gauntlet.weighting = MEAN must be EQUAL, SAMPLE_SZ or LOG_SAMPLE_SZ" \
  "$anvil" eval "$tmp/run" --icl "$tmp/tasks/tasks.yaml" --gauntlet "$tmp/g.yaml"
"$anvil" eval "$tmp/run" --icl "$bad" --data "$tmp/data" > /dev/null 2> "$tmp/usage.err"
[ $? -eq 2 ] && grep -q -- "--data is for loss evaluation, not --icl" "$tmp/usage.err" &&
  pass "--icl with --data is a usage error" || fail "--icl with --data: $(head -1 "$tmp/usage.err")"
exit $((failures > 0))
