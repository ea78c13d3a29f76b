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
