"""Writes fewshot_golden.json: what CPython's random and set give for LLM Foundry's few-shot draw
(llmfoundry/eval/datasets/utils.py, get_fewshot_sample_idxs), the expectation of test_data's
PythonRandom tests. Run with /usr/bin/python3 (CPython 3.10 or later: the set order Foundry sees). fewshot() is
also icl_reference.py's few-shot draw."""
import json
import random
import sys


def fewshot(n, num_fewshot, example_index, rng):
    k = min(n - 1, num_fewshot)
    picked = set(rng.sample(range(0, n), k))
    if example_index in picked:
        picked.remove(example_index)
        if len(picked) >= n - 1:
            return list(picked)
        r = rng.choice(range(0, n))
        while r in picked or r == example_index:
            r = rng.choice(range(0, n))
        picked.add(r)
    return list(picked)


if __name__ == "__main__":
    cases = []
    # (dataset size, shots, seed): the published tasks' shapes (winograd 273/3, copa 100/0,
    # arc_easy 2376/3, mmlu subjects of about 100/5, openbook 500/10, arc_challenge 1172/25), small
    # datasets where the test example is often drawn, and seeds beyond 32 bits.
    for n, k, seed in [(5, 3, 1234), (273, 3, 1234), (100, 3, 1234), (2376, 3, 1234), (100, 5, 1234), (500, 10, 1234),
                       (1172, 25, 1234), (12, 10, 1234), (4, 10, 7), (30, 20, 0), (1000, 40, 2**40 + 5), (2, 1, 99)]:
        rng = random.Random(seed)
        examples = min(n, 60)
        cases.append({"n": n, "shots": k, "seed": seed,
                      "fewshot": [fewshot(n, k, i, rng) for i in range(examples)]})
    draws = []
    for seed in [0, 1234, 2**32 + 1]:
        rng = random.Random(seed)
        draws.append({"seed": seed, "bits32": [rng.getrandbits(32) for _ in range(700)],
                      "sample_1000_50": random.Random(seed).sample(range(1000), 50)})
    json.dump({"python": sys.version.split()[0], "cases": cases, "draws": draws}, open(sys.argv[1], "w"))
