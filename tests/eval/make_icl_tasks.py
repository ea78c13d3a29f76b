"""Writes in-context-learning task files in LLM Foundry's formats from the Brown corpus's text,
and a task YAML naming them as Foundry's task files do.

  make_icl_tasks.py BROWN_TEXT_DIR OUT_DIR

multiple_choice (query/choices/gold): a sentence's first half, its own second half among three
others'; schema (context_options/continuation/gold): two first halves before one second half;
language_modeling (context/continuation): a sentence and its last word; a categorised
multiple_choice task (each question's category: the Brown file's genre letter);
generation_task_with_answers (context/answer/aliases, and chain_of_thought); and gauntlet.yaml,
an eval gauntlet over them in LLM Foundry's format (weighted by sample size, a category whose
benchmark is not evaluated, two averages)."""
import json
import os
import random
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
sentences = []
for name in sorted(os.listdir(src))[::12]:
    text = open(os.path.join(src, name), encoding="utf-8").read()
    for s in text.replace("\n", " ").split(". "):
        words = s.split()
        if 8 <= len(words) <= 24:
            sentences.append((name[1], words))
rng = random.Random(7)
rng.shuffle(sentences)


def halves(words):
    h = len(words) // 2
    return " ".join(words[:h]), " ".join(words[h:]) + "."


def write(name, rows):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


mc, cat = [], []
for i in range(60):
    genre, words = sentences[i]
    first, second = halves(words)
    others = [halves(sentences[(i * 7 + k * 13 + 100) % len(sentences)][1])[1] for k in range(3)]
    gold = i % 4
    choices = others[:gold] + [second] + others[gold:]
    mc.append({"query": first, "choices": choices, "gold": gold})
    cat.append({"query": first, "choices": choices, "gold": gold, "category": "genre_" + genre})
schema = []
for i in range(60, 110):
    a, b = halves(sentences[i][1]), halves(sentences[i + 100][1])
    gold = i % 2
    options = [a[0], b[0]] if gold == 0 else [b[0], a[0]]
    schema.append({"context_options": options, "continuation": a[1], "gold": gold})
# Half of the language-modeling questions end "... of" before "the" (what a model learns first),
# so that the greedy rule meets both right and wrong answers; the rest ask for a sentence's last word.
lm = []
for genre, words in sentences:
    if len(lm) < 30 and "of" in words[2:-1] and words[words.index("of", 2) + 1] == "the":
        k = words.index("of", 2)
        lm.append({"context": " ".join(words[:k + 1]), "continuation": "the"})
for i in range(110, 140):
    words = sentences[i][1]
    lm.append({"context": " ".join(words[:-1]), "continuation": words[-1]})
# generation_task_with_answers (context/answer/aliases): after "... of", the answer "the" (what a
# small model generates first; its aliases as files give them, spaced and capitalised: without
# normalisation the generation must start with one, with it "the" is emptied and matches
# anything); a sentence's first words before its next one; a few aliases that Foundry's
# normalisation empties. And a chain-of-thought task shaped like Foundry's svamp: a
# sentence's start, the next three words as the reasoning, then the answer.
gen = []
for genre, words in sentences[140:]:
    if len(gen) < 16 and "of" in words[2:-1] and words[words.index("of", 2) + 1] == "the":
        k = words.index("of", 2)
        gen.append({"context": " ".join(words[:k + 1]), "answer": "the", "aliases": [" The ", "the"]})
for i in range(200, 224):
    words = sentences[i][1]
    gen.append({"context": " ".join(words[:4]), "answer": words[4],
                "aliases": ["An"] if i % 6 == 0 else [words[4] + "s"] if i % 3 == 0 else []})
gen_cot = []
for i in range(230, 254):
    words = sentences[i][1]
    gen_cot.append({"context": " ".join(words[:4]), "chain_of_thought": " ".join(words[4:7]), "answer": words[7],
                    "aliases": [" "] if i % 4 == 0 else []})
write("mc.jsonl", mc)
write("gen.jsonl", gen)
write("gen_cot.jsonl", gen_cot)
write("mc_categories.jsonl", cat)
write("schema.jsonl", schema)
write("lm.jsonl", lm)
with open(os.path.join(out, "tasks.yaml"), "w") as f:
    f.write(f"""icl_tasks:
-
  label: brown_mc
  dataset_uri: {out}/mc.jsonl
  num_fewshot: [0, 3]
  icl_task_type: multiple_choice
  continuation_delimiter: "\\nAnswer: "
-
  label: brown_schema
  dataset_uri: {out}/schema.jsonl
  num_fewshot: [0, 2]
  icl_task_type: schema
-
  label: brown_lm
  dataset_uri: {out}/lm.jsonl
  num_fewshot: [0, 5]
  icl_task_type: language_modeling
-
  label: brown_mc_short
  dataset_uri: {out}/mc.jsonl
  num_fewshot: [5]
  icl_task_type: multiple_choice
  max_seq_len: 40
  prompt_string: "Finish each sentence."
-
  label: brown_genres
  dataset_uri: {out}/mc_categories.jsonl
  num_fewshot: [2]
  icl_task_type: multiple_choice
  has_categories: true
  question_prelimiter: "Text: "
-
  label: brown_gen
  dataset_uri: {out}/gen.jsonl
  num_fewshot: [0, 3]
  icl_task_type: generation_task_with_answers
  early_stopping_criteria: ["\\n\\n", "[.!?]"]
-
  label: brown_gen_exact
  dataset_uri: {out}/gen.jsonl
  num_fewshot: [1]
  icl_task_type: generation_task_with_answers
  do_normalization: false
-
  label: brown_gen_kwargs
  dataset_uri: {out}/gen.jsonl
  num_fewshot: [1]
  icl_task_type: generation_task_with_answers
  generation_kwargs: {{max_new_tokens: 2, eos_token_id: [50256, 13, 11], do_sample: false, num_beams: 1, use_cache: true}}
-
  label: brown_gen_cot
  dataset_uri: {out}/gen_cot.jsonl
  num_fewshot: [2]
  icl_task_type: generation_task_with_answers
  cot_delimiter: "The answer is "
  continuation_delimiter: "\\n\\nA:"
  question_prelimiter: "Question: "
  do_normalization: false
  early_stopping_criteria: ["\\n\\n", "Question:"]
  max_seq_len: 48
""")
with open(os.path.join(out, "gauntlet.yaml"), "w") as f:
    f.write("""eval_gauntlet:
  weighting: SAMPLE_SZ
  subtract_random_baseline: true
  rescale_accuracy: true
  averages:
    core_average: [sentences, words]
    nothing_average: [unevaluated]
  categories:
  - name: sentences
    benchmarks:
    - {name: brown_mc, num_fewshot: 3, random_baseline: 0.25}
    - {name: brown_schema, num_fewshot: 2, random_baseline: 0.5}
    - {name: brown_genres, num_fewshot: 2, random_baseline: 0.25}
  - name: words
    benchmarks:
    - {name: brown_lm, num_fewshot: 5, random_baseline: 0}
    - {name: brown_mc_short, num_fewshot: 5, random_baseline: 0.25}
  - name: unevaluated
    benchmarks:
    - {name: brown_lm, num_fewshot: 0, random_baseline: 0}
    - {name: brown_mc, num_fewshot: 1, random_baseline: 0.25}
""")
