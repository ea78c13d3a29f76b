// The anvil command line. Every subcommand parses its flags here and calls into the library;
// errors from the library arrive as anvil::Error and end the process with one line and exit 1.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/submit.h"
#include "config/train_config.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/suggest.h"
#include "data/tokenizer.h"
#include "data/loader.h"
#include "data/chat_template.h"
#include "data/finetuning.h"
#include "data/prepare.h"
#include "data/tools.h"
#include "parallel/bench_comm.h"
#include "kernels/bench_gemm.h"
#include "kernels/blas.h"
#include "interop/hf_export.h"
#include "interop/hf_import.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "train/bench.h"
#include "ckpt/checkpoint.h"
#include "train/doctor.h"
#include "train/eval.h"
#include "train/icl_eval.h"
#include "train/generate.h"
#include "train/loss_plot.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

constexpr const char* kUsage = R"(anvil: train GPT-style language models on CPUs and GPUs, from one process to a cluster

usage: anvil COMMAND [ARGS]

commands:
  train CONFIG.yaml [key=value ...]    train a model; dotted keys override the YAML (optimizer.lr=3e-4)
  data prepare --out DIR INPUT...      tokenize text/JSONL into a train/val MDS dataset
  data inspect DIR                     shards, samples, tokens and a decoded sample of an MDS dataset
  tokenize [--decode]                  GPT-2 token ids of standard input, one per line (--decode: back)
  generate CHECKPOINT --prompt TEXT    sample a continuation from a trained model
  eval CHECKPOINT --data DIR           loss and perplexity of a checkpoint on a dataset split
  export CHECKPOINT OUT_DIR            a Hugging Face transformers model directory from a checkpoint
  import HF_DIR OUT_DIR                a Hugging Face model directory as a checkpoint to fine-tune
  inspect CHECKPOINT                   a checkpoint's manifest in brief, verified, with a weight digest
  plot RUN_DIR... [-o loss.png]        loss and eval loss against tokens of one or several runs, as a PNG
  submit CONFIG.yaml --nodes N ...     a training run as a SLURM batch job that survives preemption
  bench train CONFIG.yaml [key=value]  time the training step: tokens/s, GFLOP/s, MFU
  bench data LOCATION                  tokens/s the data loader delivers from a dataset or remote
  bench comm                           all-reduce bandwidth of anvil's algorithms and MPI's (under mpirun)
  bench gemm                           anvil's CPU matrix products beside OpenBLAS's sgemm
  doctor                               this machine's CPU, GPUs and MPI, and self-tests of ops and all-reduce

Run `anvil COMMAND --help` for a command's options.
)";

constexpr const char* kTrainHelp = R"(usage: anvil train CONFIG.yaml [key=value ...]

Trains the model the YAML describes (LLM Foundry key names: model.n_layers, model.d_model,
model.n_heads, max_seq_len, global_train_batch_size, device_train_microbatch_size,
optimizer.lr, scheduler.t_warmup, max_duration, eval_interval, precision, seed, ...).
Each key=value overrides a dotted key of the YAML; later ones win.

The run directory (run_dir, default runs/<config name>) receives config.yaml (resolved),
train.log, metrics.jsonl (one JSON object per step) and checkpoints/ (every save_interval and
at the end). autoresume=true continues the run in run_dir from its newest good checkpoint;
load_path=CKPT continues from a given one. SIGTERM, SIGINT or SIGUSR1 (to any rank) stops the
run after the step in progress, writes a checkpoint and exits with status 75; a second Ctrl-C
stops at once.

Data parallel: launch N ranks with `mpirun -np N anvil train ...` (or `srun --mpi=pmix` under
SLURM); distributed.zero_stage=0..3 chooses what is sharded (docs/distributed.md).
distributed.pipeline_parallel=P cuts the blocks into P stages, each trained by N/P ranks, with
the same weights as one process (deterministic mode, ZeRO 0 or 1, kernels=cpu).
distributed.expert_parallel=R shares a mixture of experts' experts among groups of R ranks,
each rank holding its own experts' weights alone, rows exchanged all-to-all in each layer; the
same weights as one process (deterministic mode, kernels=cpu).
distributed.tensor_parallel=N shares each block's heads and MLP, and the vocabulary, among
groups of N ranks (Megatron's split), the parts of each sum added in a fixed order; the same
weights as one process (deterministic mode, kernels=cpu).

Memory: device_train_microbatch_size=auto picks the largest microbatch that fits memory_limit
(default: the memory free at start); activation_checkpointing=true recomputes each block in the
backward pass instead of storing it. Neither changes a bit of the result.
DeepSpeed: deepspeed_config=ds_config.json is a layer between the YAML and the command line:
its batch sizes, bf16/fp16, ZeRO stage, clipping, Adam/AdamW and schedulers, with DeepSpeed's
defaults and Hugging Face's "auto" values; train.log lists what it set.
See docs/config.md for every key.

examples:
  anvil train configs/demo.yaml
  anvil train configs/demo.yaml max_duration=50ba optimizer.lr=1e-3 run_dir=runs/quick
  anvil train configs/mpt-125m.yaml deepspeed_config=ds_config.json
  mpirun -np 4 anvil train configs/llama-125m.yaml distributed.zero_stage=3
  anvil train configs/demo.yaml run_dir=runs/demo autoresume=true
)";

constexpr const char* kPrepareHelp = R"(usage: anvil data prepare --out DIR [options] INPUT...
       anvil data prepare --format finetuning --out DIR [options] INPUT
       anvil data inspect DIR [--tokenizer NAME]

prepare: tokenizes each document (GPT-2's tokenizer by default: the text, then <|endoftext|>;
a SentencePiece model: its BOS, the text, its EOS, as Llama's documents are), and packs the
token stream into samples of exactly --max-seq-len tokens, written as MDS (MosaicML
streaming's format, column "tokens": ndarray:int32) under DIR/train and DIR/val, each with
tokenizer_record.json naming the tokenizer (training refuses data made by another one). A text
file is one document; each line of a .jsonl/.json/.ndjson file is a JSON object whose text
field is one document. Directories are read recursively in name order. The same inputs and
options give the same bytes.

options:
  --out DIR             output directory (must not exist; written atomically)
  --max-seq-len N       tokens per sample (default 2048)
  --val-fraction F      fraction of documents held out for validation (default 0.05); with too
                        few documents for a val sample, the last fraction of the tokens instead
  --text-field NAME     JSONL field holding the text (default text)
  --compression C       zstd or zstd:LEVEL (1-22); default none
  --hashes LIST         comma-separated shard hashes, e.g. sha1,xxh64 (default xxh64)
  --size-limit BYTES    shard size limit (default 67108864)
  --tokenizer NAME      gpt2 (default: GPT-2's vocabulary from $ANVIL_TOKENIZER_DIR or the copy
                        scripts/setup.sh installs), a directory holding a tokenizer's files
                        (tokenizer.model: SentencePiece; vocab.json + merges.txt or encoder.json +
                        vocab.bpe: GPT-2 byte-level BPE; else tokenizer.json: transformers' fast
                        tokenizer), or a SentencePiece .model file

prepare --format finetuning: reads fine-tuning records, as LLM Foundry reads them: JSON lines
(or one JSON array) of {"prompt": ..., "response": ...} ("completion" for "response" too) or
{"messages": [{"role": ..., "content": ...}, ...]}, a chat rendered with the chat template.
INPUT is a .jsonl/.json file (the train split) or a directory whose files name their split as
Hugging Face's json loader finds them (train.jsonl, validation.jsonl, data/test-00.jsonl, ...).
Each split is tokenized into DIR/SPLIT as LLM Foundry's tokenized fine-tuning MDS (column
"turns": json, a prompt's input_ids and its response's labels per turn). Examples that are
empty, or have no token carrying loss within --max-seq-len, are dropped; those longer than
--max-seq-len are truncated or dropped (--too-long); every count is reported. --out,
--tokenizer, --compression, --hashes and --size-limit as above, and:
  --max-seq-len N       the training max_seq_len (default 2048)
  --splits LIST         comma-separated splits to prepare (default: every split INPUT holds)
  --target-prompts P    none (default), all or length>=N: which prompts carry loss
  --target-responses R  last (default) or all: which responses carry loss
  --too-long T          truncate (default) or drop
  --chat-template T     auto (default: the tokenizer's own chat template where it has one, else
                        chatml), tokenizer (its own, required), or chatml
  --skip-malformed      skip (and count) malformed records instead of stopping at the first

inspect: checks every shard of an MDS dataset against its index and prints the shard, sample
and token counts, the tokenizer that made it, and the first sample decoded (with that
tokenizer, or --tokenizer).

examples:
  anvil data prepare book.txt --out data/book
  anvil data prepare --out data/brown --max-seq-len 128 --val-fraction 0.05 data/brown-text
  anvil data prepare --tokenizer sp.model --text-field content --compression zstd --out data/sp corpus.jsonl
  anvil data prepare --format finetuning --max-seq-len 512 --out data/sft sft-records/
  anvil data inspect data/brown/train
)";

constexpr const char* kPlotHelp = R"(usage: anvil plot RUN_DIR [RUN_DIR...] [-o FILE.png] [--size WxH]

Draws each run's training loss (solid) and eval loss (dashed, with points) against the tokens
seen, read from RUN_DIR/metrics.jsonl, on one figure: a run beside another, or a CPU run beside a
GPU run of the same config. Every run directory also gets its own loss.png at the end of training.

options:
  -o FILE        the PNG to write (default loss.png); written under a temporary name and renamed
  --size WxH     pixels (default 1000x600)

examples:
  anvil plot runs/demo
  anvil plot runs/cpu runs/gpu -o cpu-vs-gpu.png
)";

constexpr const char* kSubmitHelp = R"(usage: anvil submit CONFIG.yaml [key=value ...] --nodes N --tasks-per-node K [options]

Submits a training run to SLURM. Writes into the run directory the resolved config with
autoresume on (job.yaml) and a batch script (job.sbatch) that starts N x K ranks with
`srun --mpi=pmix`, asks for SIGUSR1 before the time limit (anvil then saves a checkpoint and
exits 75, and the script requeues the job) and is requeueable (--requeue): a preempted or
requeued job continues from its newest checkpoint, bit for bit. Then runs sbatch and prints the
job id; the job's output goes to RUN_DIR/slurm-JOBID.out. Submitting the same run again
continues it.

options:
  --nodes N             nodes (default 1)
  --tasks-per-node K    ranks per node: one per GPU, or per CPU socket (default 1)
  --gpus-per-node G     GPUs to ask for on each node (with kernels=gpu)
  --time T              SLURM's time limit (e.g. 4:00:00 or 2-00:00:00)
  --partition P         the partition
  --account A           the account to charge
  --signal-seconds S    how long before the time limit the stop signal comes (default 120)
  --dry-run             print the batch script; write and submit nothing

examples:
  anvil submit configs/mpt-125m.yaml --nodes 2 --tasks-per-node 8 --gpus-per-node 8 kernels=gpu --time 12:00:00
  anvil submit configs/demo.yaml run_dir=runs/demo-slurm --nodes 1 --tasks-per-node 2 --dry-run
)";

constexpr const char* kTokenizeHelp = R"(usage: anvil tokenize [--decode] [--chat [options]] [--tokenizer NAME]

Reads standard input and prints its token ids, one per line: the text's tokens alone, without
BOS or EOS (GPT-2's tokenizer unless --tokenizer names another, as for `anvil data prepare`).
With --decode, reads ids (whitespace-separated) and writes the bytes they stand for.

With --chat, standard input is a chat: a JSON list of messages ({"role": ..., "content": ...}),
or an object holding "messages" and any further variables of the template (tools, documents,
enable_thinking, ...). It is rendered with the tokenizer's own chat template (chat_template.jinja,
or chat_template in tokenizer_config.json) as transformers' apply_chat_template renders it, and
its ids printed as apply_chat_template(tokenize=True) gives them (no special tokens added: the
template writes them).
  --add-generation-prompt  end with the template's prompt for the assistant's reply
  --chat-template T        chatml, or a .jinja file (or a JSON file holding chat_template) to
                           render with instead of the tokenizer's
  --text                   print the rendered text instead of its ids

examples:
  echo "Hello world" | anvil tokenize
  echo "15496 995" | anvil tokenize --decode
  anvil tokenize --tokenizer sp.model < notes.txt
  echo '[{"role": "user", "content": "Hi"}]' | anvil tokenize --chat --text --add-generation-prompt --tokenizer qwen3
)";

constexpr const char* kDoctorHelp = R"(usage: anvil doctor

Reports what anvil finds here: the CPU and its BLAS, the GPU backend this build has (CUDA, HIP or
none) and every visible GPU (name, architecture, multiprocessors, memory), and the communicator
(MPI library and ranks; run it under mpirun to check a multi-process launch) and the tokenizers the
build reads (SentencePiece needs libsentencepiece at build time). Then self-tests:
the fast CPU kernels and, with a GPU, the GPU kernels against the reference ops (relative error
of matmul, layer norm, attention forward and backward, cross-entropy), and an all-reduce of
integers that must come out exact on every rank. Exits 1 if a self-test fails.

examples:
  anvil doctor
  mpirun -np 2 anvil doctor
)";

constexpr const char* kInspectHelp = R"(usage: anvil inspect CHECKPOINT

CHECKPOINT: a checkpoint directory, or a run directory (its checkpoints/latest). Reassembles the
tensors from the shard files, verifies every checksum, and prints the step, tokens seen, number of
shards, model, where the data order stands, and the SHA-256 of the weights (every parameter's
float32 bytes in layout order): two checkpoints with the same digest hold bit-identical weights,
whatever world size or ZeRO stage trained them.

examples:
  anvil inspect runs/demo
  anvil inspect runs/demo/checkpoints/step-00000100
)";

constexpr const char* kEvalHelp = R"(usage: anvil eval CHECKPOINT_OR_HF_DIR --data DIR [--split val] [--max-samples N] [--batch B]
       anvil eval CHECKPOINT_OR_HF_DIR --icl TASKS.yaml [--gauntlet GAUNTLET.yaml] [--json] [--batch B]
                  [--max-seq-len N]

The mean loss per target token (and its perplexity) of CHECKPOINT (a checkpoint directory, a run
directory: its latest, or a Hugging Face transformers model directory) on the first N samples of an MDS dataset's split, in the dataset's
order, at the model's max_seq_len: the figure training's evaluation gives on the same samples.
A fine-tuning dataset (`anvil data prepare --format finetuning`) is scored on the tokens a
finetuning loader trains on by default: each example's last response and its EOS.
The last line is the same figures as JSON, for scripts.

With --icl, LLM Foundry's in-context-learning tasks instead: TASKS.yaml is a Foundry task file
(an icl_tasks: list of label, dataset_uri, num_fewshot, icl_task_type and the prompt keys; the
dataset_uri paths relative to the working directory, as Foundry reads them). Each task at each
shot count prints its accuracy as Foundry's metrics compute it (multiple_choice and schema: the
choice with the lowest mean loss per continuation token; language_modeling: every continuation
token the greedy prediction; generation_task_with_answers: the greedy generation, cut at the
stop strings and after the chain of thought's delimiter, starting with an answer), with the
few-shot examples Foundry draws (docs/eval.md). A task with categories prints each category and
their mean. With --gauntlet, then Foundry's eval gauntlet over those scores (its
eval_gauntlet files as published): each category's score and each average; a category whose
benchmarks were not all evaluated is left out and named on standard error, as Foundry leaves it.

options:
  --data DIR          the dataset (as `anvil data prepare` writes it)
  --split S           its split (default val)
  --max-samples N     the first N samples (default: the whole split)
  --batch B           sequences per forward pass (default 8; does not change the figure)
  --icl TASKS.yaml    LLM Foundry's in-context-learning tasks
  --gauntlet G.yaml   (--icl) LLM Foundry's eval gauntlet over the tasks' scores
  --json              (--icl) one JSON line per task and shot count: {"task": "piqa/0-shot", ...},
                      then per gauntlet category and average: {"gauntlet": "world_knowledge", ...}
  --max-seq-len N     (--icl) the longest row, its context cut from the left (default: the model's)

examples:
  anvil eval runs/demo --data data/brown --max-samples 64
  anvil eval runs/mpt-125m --icl tasks.yaml --gauntlet eval_gauntlet.yaml --json
)";

constexpr const char* kExportHelp = R"(usage: anvil export CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size SIZE]
                    [--merge-lora | --adapter]

Writes CHECKPOINT (a checkpoint directory, or a run directory: its latest) as a new directory
that Hugging Face transformers loads with AutoModelForCausalLM.from_pretrained(OUT_DIR):
config.json (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, or MPTForCausalLM for model_type mpt),
generation_config.json, the weights in safetensors under transformers' tensor names, and the
tokenizer's files (GPT-2 BPE: vocab.json, merges.txt; SentencePiece: tokenizer.model;
tokenizer.json as it was read; each with tokenizer_config.json and special_tokens_map.json). A model that
transformers' architecture for its family cannot hold (an MPT with learned positions, a GPT-2
with RMSNorm) is an error naming what it lacks. OUT_DIR must not exist; it appears complete or
not at all.

A LoRA run's checkpoint holds its adapters alone, and names its base (where it was loaded from,
and the weights' SHA-256, which must still match): --merge-lora writes the base with the adapters
folded in (W + lora_alpha/r·B·A) as above; --adapter writes PEFT's adapter directory instead
(adapter_config.json, adapter_model.safetensors), which PeftModel.from_pretrained loads on top of
the base exported by itself.

options:
  --dtype D             fp32 (default), bf16 or fp16: the stored tensors' type (rounded to nearest even)
  --max-shard-size S    above S (default 5gb; kb, mb, gb accepted) the weights are split into
                        model-0000i-of-0000N.safetensors with model.safetensors.index.json
  --tokenizer NAME      the tokenizer to write (default: the checkpoint's tokenizer.name), named
                        as for `anvil data prepare`
  --merge-lora          a LoRA checkpoint as a whole model: its adapters merged into its base
  --adapter             a LoRA checkpoint's adapters as PEFT's files

examples:
  anvil export runs/llama-125m hf/llama-125m --dtype bf16
  anvil export runs/llama-lora hf/llama-lora-merged --merge-lora
  anvil export runs/llama-lora hf/llama-lora-adapter --adapter
)";

constexpr const char* kImportHelp = R"(usage: anvil import HF_DIR OUT_DIR

Reads a Hugging Face transformers model directory (config.json with model.safetensors, or shards
named by model.safetensors.index.json; F32, BF16 or F16 tensors) of a GPT-2 (model_type gpt2),
Llama (llama), Mistral (mistral), Mixtral (mixtral), Qwen2 (qwen2), Qwen3 (qwen3), Qwen3-MoE
(qwen3_moe) or MPT (mpt) and writes its weights as the step-0 checkpoint of a new run directory
OUT_DIR. `anvil train CONFIG load_path=OUT_DIR` fine-tunes it (a fresh optimizer, from step 0,
with a config whose model section describes the same model), and `anvil generate`, `anvil eval`
and `anvil export` read it. GPT-2's original files (names without "transformer.", attn.bias
buffers) are accepted. Llama 3.1's rope_scaling (llama3, linear) is honoured. A config field anvil
cannot honour (another rope_scaling type, a sliding window or biases in a Llama, Qwen's
use_sliding_window, transformers' MoE router loss) or a tensor the config does not describe is an
error naming it; nothing is written then.

example:
  anvil import hf/gpt2 runs/gpt2-base
  anvil train configs/bench-124m.yaml load_path=runs/gpt2-base run_dir=runs/gpt2-tuned
)";

constexpr const char* kGenerateHelp = R"(usage: anvil generate CHECKPOINT --prompt TEXT [options]

CHECKPOINT is a checkpoint directory, a run directory (its latest checkpoint is used), or a
Hugging Face transformers model directory (as `anvil import` reads it). Prints the prompt
followed by the sampled continuation; with --chat, the assistant's reply to the prompt.

options:
  --prompt TEXT         text to continue (required)
  --max-new-tokens N    tokens to generate (default 64)
  --temperature T       softmax temperature; 0 picks the most likely token (default 0.8)
  --top-k K             sample among the K most likely tokens; 0 for all (default 40)
  --top-p P             then among the fewest of them whose probability reaches P (default 1: all)
  --seed S              sampling seed (default 0)
  --tokenizer NAME      as for `anvil data prepare` (default: the checkpoint's tokenizer.name, or
                        the Hugging Face directory's own tokenizer files, else gpt2)
  --chat                the prompt is a user's message: the chat is rendered with the tokenizer's
                        own chat template and its generation prompt (as transformers'
                        apply_chat_template), and the reply ends at the tokenizer's EOS
  --system TEXT         with --chat: a system message first
  --chat-template T     with --chat: chatml, or a .jinja file, instead of the tokenizer's template

examples:
  anvil generate runs/demo --prompt "The jury said"
  anvil generate hf/qwen3 --chat --prompt "Name a prime number." --temperature 0
  anvil generate runs/demo/checkpoints/step-00000300 --prompt "Once" --temperature 0
  anvil generate hf/llama --prompt "The" --max-new-tokens 32 --top-p 0.9 --seed 3
)";

constexpr const char* kBenchHelp = R"(usage: anvil bench train CONFIG.yaml [key=value ...] [--steps N] [--warmup N] [--profile]
       mpirun -np N anvil bench train CONFIG.yaml distributed.tensor_parallel=T distributed.pipeline_parallel=P [...]
       mpirun -np R anvil bench train CONFIG.yaml distributed.expert_parallel=R [...]
       anvil bench data LOCATION [options]
       mpirun -np N anvil bench comm [--min-bytes B] [--max-bytes B]
       anvil bench gemm [--rounds N] [--seconds S]

train: runs the config's training step on synthetic tokens (no dataset needed) and reports
tokens/s, achieved GFLOP/s, the measured GEMM peak (on the CPU the faster of OpenBLAS's sgemm
and anvil's GEMM in the precision's mode; with kernels=gpu, cuBLASLt in that mode), MFU and peak memory
(host RSS, and the GPU allocator's peak). The last line is the same figures as JSON, for scripts.
Under mpirun on T·P ranks with distributed.tensor_parallel=T and distributed.pipeline_parallel=P,
the ranks share one copy of the model (T ranks share each stage's blocks, P stages in the 1F1B
order) and rank 0 reports the copy's speed, every rank's memory and the pipeline's bubble. With
distributed.expert_parallel=R instead of T (a mixture of experts), R ranks share each stage's
experts, each taking its block of the batch as in training, and the report adds the MiB the
ranks sent each other a step (all-to-all).
  --steps N     timed steps (default 10)
  --warmup N    untimed steps first (default 2; under deterministic_mode an early step can run
                twice when its gradients outgrow their fixed-point scale: the report says how
                many timed steps did, and a larger --warmup leaves them out)
  --profile     also print the time per op over the timed steps (every op timed: on the GPU by
                events on its stream), largest first, and what the step spent outside the ops

data: reads LOCATION (an MDS dataset directory, or s3://, http(s):// holding one) through the
training loader twice, the first pass cold (downloading into the cache) and the second over
the warm cache, and reports tokens/s delivered. The last line is JSON.
  --seq-len T   tokens per sample (default 256)
  --batch N     global batch size (default 8)
  --workers N   loader worker threads (default 1)
  --steps N     batches per pass (default: one epoch)
  --cache DIR   cache directory for a remote (default: a temporary one, removed after)

comm: for sizes doubling from --min-bytes (default 8) to --max-bytes (default 256mb; k, kb, mb,
gb accepted), times the all-reduce of a float buffer with each anvil algorithm (ring,
recursive_doubling, rank_ordered) and with the MPI library's own MPI_Allreduce, in the same run,
and prints the time, algbw and busbw (nccl-tests' definitions: algbw = bytes / time, busbw =
algbw * 2(W-1)/W, time = the slowest rank's mean). Then, per size, the ratio of anvil's ring to
MPI's busbw. Each row is also printed as JSON.

gemm: times the CPU's matrix products of training (bench-16m's and GPT-2 124M's linear layers,
their forward, input-gradient and weight-gradient products, and a 2048 square) with anvil's GEMM
on all threads, in fp32 and in the bf16 mode of amp_bf16, and with OpenBLAS's sgemm, alternating,
and prints GFLOP/s and the ratios to OpenBLAS. bf16 is timed on each instruction set this CPU
runs it on: fp32 FMAs on rounded operands and VDPBF16PS (AVX512-BF16), which give the same bits,
and AMX tiles, whose bits are their own; * marks the one training uses (AMX where the CPU has it,
else the faster of the other two, timed once when a run starts). Where libdnnl.so.2 is
installed, oneDNN's matmul (what PyTorch's CPU autocast uses) is timed too, in fp32 and on bf16
operands rounded beforehand. Each row is also printed as JSON.
  --rounds N    alternating rounds; each side's best is kept (default 3)
  --seconds S   time each product at least S seconds per round (default 0.3)

examples:
  anvil bench train configs/bench-16m.yaml --steps 5 --profile
  anvil bench train configs/bench-llama-16m.yaml precision=amp_bf16
  anvil bench data s3://bucket/brown/train --cache /tmp/cache --workers 2
  mpirun -np 4 anvil bench comm --max-bytes 64mb
  anvil bench gemm --rounds 3
)";

struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;  // --name value
  std::vector<std::string> switches;                        // --name
};

[[noreturn]] void usage_error(const std::string& msg, const char* help) {
  std::fprintf(stderr, "anvil: %s\n\n%s", msg.c_str(), help);
  std::exit(2);
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// Splits args into positionals and flags; value_flags take a value, switch_flags do not.
Args parse_args(const std::vector<std::string>& args, const std::vector<std::string>& value_flags,
                const std::vector<std::string>& switch_flags, const char* help) {
  Args out;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      if (std::find(switch_flags.begin(), switch_flags.end(), a) != switch_flags.end()) {
        out.switches.push_back(a);
      } else if (std::find(value_flags.begin(), value_flags.end(), a) != value_flags.end()) {
        if (i + 1 >= args.size()) usage_error(a + " needs a value", help);
        out.flags.emplace_back(a, args[++i]);
      } else {
        std::vector<std::string> known = value_flags;
        known.insert(known.end(), switch_flags.begin(), switch_flags.end());
        known.push_back("--help");
        usage_error("unknown option " + a + did_you_mean(a, known), help);
      }
    } else {
      out.positional.push_back(a);
    }
  }
  return out;
}

std::string flag(const Args& a, const std::string& name, const std::string& fallback) {
  std::string v = fallback;
  for (const auto& [k, val] : a.flags)
    if (k == name) v = val;
  return v;
}

bool has_switch(const Args& a, const std::string& name) {
  return std::find(a.switches.begin(), a.switches.end(), name) != a.switches.end();
}

template <typename T>
T number_flag(const Args& a, const std::string& name, T fallback, const char* help) {
  const std::string v = flag(a, name, "");
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    T out;
    if constexpr (std::is_integral_v<T>) out = static_cast<T>(std::stoll(v, &used));
    else out = static_cast<T>(std::stod(v, &used));
    if (used != v.size()) throw std::invalid_argument(v);
    return out;
  } catch (const std::exception&) {
    usage_error(name + " expects a number, got '" + v + "'", help);
  }
}

int cmd_train(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kTrainHelp, stdout), 0;
  if (args.empty()) usage_error("train needs a config file", kTrainHelp);
  if (args[0].rfind("--", 0) == 0) usage_error("unknown option " + args[0] + did_you_mean(args[0], {"--help"}), kTrainHelp);
  for (size_t i = 1; i < args.size(); i++)
    if (args[i].find('=') == std::string::npos) usage_error("'" + args[i] + "' is not a key=value override", kTrainHelp);
  const TrainConfig cfg = load_train_config(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
  std::unique_ptr<Communicator> comm =
      make_communicator(/*require_mpi=*/false, /*threads_at_once=*/cfg.distributed.pipeline_parallel > 1 ||
                                                   cfg.distributed.expert_parallel > 1 ||
                                                   cfg.distributed.tensor_parallel > 1);
  const TrainSummary s = run_training(cfg, *comm);
  if (comm->rank() != 0) return s.stopped_by != 0 ? kExitStopped : 0;
  if (s.first_eval_loss >= 0)
    std::printf("eval loss: %.4f before training, %.4f after %lld steps\n", s.first_eval_loss, s.last_eval_loss,
                static_cast<long long>(s.steps));
  else if (s.last_eval_loss >= 0)
    std::printf("eval loss: %.4f after %lld steps\n", s.last_eval_loss, static_cast<long long>(s.steps));
  std::printf("final train loss: %.4f\ncheckpoint: %s\n", s.final_train_loss, s.checkpoint.c_str());
  if (cfg.precision == ComputeDtype::kFp16)
    std::printf("skipped steps (fp16 overflow): %lld\n", static_cast<long long>(s.skipped_steps));
  if (s.stopped_by != 0) {
    std::printf("stopped by %s after step %lld; continue with autoresume=true\n", signal_name(s.stopped_by),
                static_cast<long long>(s.steps));
    return kExitStopped;
  }
  return 0;
}

// The comma-separated words of a flag's value.
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    if (comma > pos) out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

int prepare_finetuning_command(const Args& a) {
  if (a.positional.size() != 1)
    usage_error("--format finetuning takes one INPUT: a .jsonl/.json file or a directory of them", kPrepareHelp);
  const std::string input = a.positional[0], out = flag(a, "--out", "");
  if (out.empty()) usage_error("--out DIR is required", kPrepareHelp);
  FinetuningPrepareOptions opt;
  opt.max_seq_len = number_flag(a, "--max-seq-len", 2048, kPrepareHelp);
  opt.mds.compression = flag(a, "--compression", "");
  opt.mds.size_limit = number_flag<int64_t>(a, "--size-limit", int64_t{1} << 26, kPrepareHelp);
  opt.mds.hashes = comma_list(flag(a, "--hashes", "xxh64"));
  std::sort(opt.mds.hashes.begin(), opt.mds.hashes.end());
  FinetuningConfig& ft = opt.finetuning;
  ft.hf_name = input;
  ft.targets = parse_target_policy(flag(a, "--target-prompts", "none"), flag(a, "--target-responses", "last"),
                                   "--target-prompts/--target-responses");
  const std::string too_long = flag(a, "--too-long", "truncate");
  if (!parse_choice(too_long, &ft.too_long))
    usage_error("--too-long '" + too_long + "' is not known: expected truncate or drop", kPrepareHelp);
  ft.chat_template = chat_template_named(flag(a, "--chat-template", "auto"), "--chat-template");
  ft.skip_malformed = !a.switches.empty();  // --skip-malformed, the one switch
  std::vector<std::string> splits = comma_list(flag(a, "--splits", ""));
  if (splits.empty()) splits = std::filesystem::is_directory(input) ? finetuning_splits(input)
                                                                     : std::vector<std::string>{"train"};
  ANVIL_CHECK(!std::filesystem::exists(out), "output directory '{}' already exists; remove it or choose another --out",
              out);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(flag(a, "--tokenizer", "gpt2"));
  ft.chat_template = resolve_chat_template(ft.chat_template, tokenizer->files());
  for (const std::string& split : splits) {
    const std::vector<std::string> files = finetuning_files(ft, split, input);
    const FinetuningReport r = prepare_finetuning(files, out + "/" + split, *tokenizer, opt);
    std::printf("prepared %s/%s from %zu file(s): %s\n", out.c_str(), split.c_str(), files.size(),
                r.summary().c_str());
    for (const std::string& p : r.problems) std::printf("  skipped %s\n", p.c_str());
  }
  write_file_atomic(out + "/chat_template.json", chat_template_json(ft.chat_template));
  return 0;
}

int cmd_data(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "prepare" && args[0] != "inspect")) {
    if (wants_help(args)) return std::fputs(kPrepareHelp, stdout), 0;
    usage_error("data needs a subcommand: prepare or inspect" +
                    (args.empty() ? std::string() : did_you_mean(args[0], {"prepare", "inspect"})),
                kPrepareHelp);
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (wants_help(rest)) return std::fputs(kPrepareHelp, stdout), 0;
  if (args[0] == "inspect") {
    Args a = parse_args(rest, {"--tokenizer"}, {}, kPrepareHelp);
    if (a.positional.size() != 1) usage_error("data inspect needs one dataset directory", kPrepareHelp);
    const std::string report = inspect_dataset(a.positional[0], flag(a, "--tokenizer", ""));
    std::fwrite(report.data(), 1, report.size(), stdout);
    return 0;
  }
  Args a = parse_args(rest, {"--out", "--val-fraction", "--max-seq-len", "--text-field", "--compression", "--hashes",
                             "--size-limit", "--tokenizer", "--format", "--splits", "--target-prompts",
                             "--target-responses", "--too-long", "--chat-template"}, {"--skip-malformed"},
                      kPrepareHelp);
  const std::string format = flag(a, "--format", "text");
  if (format != "text" && format != "finetuning")
    usage_error("--format '" + format + "' is not known: expected text or finetuning", kPrepareHelp);
  const bool finetuning = format == "finetuning";
  auto given = [&](const std::string& f) {
    return std::any_of(a.flags.begin(), a.flags.end(), [&](const auto& kv) { return kv.first == f; }) ||
           has_switch(a, f);
  };
  for (const char* f : {"--splits", "--target-prompts", "--target-responses", "--too-long", "--chat-template",
                        "--skip-malformed"})
    if (!finetuning && given(f)) usage_error(std::string(f) + " goes with --format finetuning", kPrepareHelp);
  for (const char* f : {"--val-fraction", "--text-field"})
    if (finetuning && given(f)) usage_error(std::string(f) + " is for --format text", kPrepareHelp);
  if (finetuning) return prepare_finetuning_command(a);
  PrepareOptions opt;
  opt.inputs = a.positional;
  opt.out_dir = flag(a, "--out", "");
  if (opt.out_dir.empty()) usage_error("--out DIR is required", kPrepareHelp);
  if (opt.inputs.empty()) usage_error("name at least one input file or directory", kPrepareHelp);
  opt.tokenizer = flag(a, "--tokenizer", "gpt2");
  opt.val_fraction = number_flag(a, "--val-fraction", 0.05, kPrepareHelp);
  opt.max_seq_len = number_flag(a, "--max-seq-len", 2048, kPrepareHelp);
  opt.text_field = flag(a, "--text-field", "text");
  opt.mds.compression = flag(a, "--compression", "");
  opt.mds.size_limit = number_flag<int64_t>(a, "--size-limit", int64_t{1} << 26, kPrepareHelp);
  opt.mds.hashes = comma_list(flag(a, "--hashes", "xxh64"));
  std::sort(opt.mds.hashes.begin(), opt.mds.hashes.end());
  const PrepareSummary s = prepare_dataset(opt);
  std::printf("prepared %s: %lld document%s -> %lld train and %lld val samples of %d tokens (%lld tokens short of a "
              "last sample dropped), %.1f MiB\n", opt.out_dir.c_str(), static_cast<long long>(s.documents), s.documents == 1 ? "" : "s",
              static_cast<long long>(s.train_samples), static_cast<long long>(s.val_samples), opt.max_seq_len,
              static_cast<long long>(s.dropped_tokens), s.bytes_written / 1048576.0);
  if (s.val_by_tokens)
    std::printf("the documents held out for validation (a fraction %g) made no whole sample (too few or too short "
                "documents): val is the last %lld tokens of the text instead\n", opt.val_fraction,
                static_cast<long long>(s.val_samples) * opt.max_seq_len);
  return 0;
}

int cmd_tokenize(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kTokenizeHelp, stdout), 0;
  Args a = parse_args(args, {"--tokenizer", "--chat-template"}, {"--decode", "--chat", "--add-generation-prompt", "--text"},
                      kTokenizeHelp);
  if (!a.positional.empty()) usage_error("tokenize reads standard input and takes no file arguments", kTokenizeHelp);
  const bool chat = has_switch(a, "--chat");
  for (const char* f : {"--add-generation-prompt", "--text"})
    if (!chat && has_switch(a, f)) usage_error(std::string(f) + " goes with --chat", kTokenizeHelp);
  if (!chat && !flag(a, "--chat-template", "").empty()) usage_error("--chat-template goes with --chat", kTokenizeHelp);
  if (chat && has_switch(a, "--decode")) usage_error("--decode and --chat exclude each other", kTokenizeHelp);
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (chat) {
    nlohmann::ordered_json in;
    try {
      in = nlohmann::ordered_json::parse(input);
    } catch (const std::exception& e) {
      ANVIL_FAIL("--chat: standard input is not valid JSON ({})", e.what());
    }
    ANVIL_CHECK(in.is_array() || (in.is_object() && in.contains("messages")), "--chat: standard input must be a list "
                "of messages or an object holding \"messages\", got {}", in.type_name());
    nlohmann::ordered_json messages = in.is_array() ? in : in["messages"];
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    if (in.is_object()) {
      extra = in;
      extra.erase("messages");
    }
    // The text needs the tokenizer's files only (its template and special tokens), not the tokenizer.
    const TokenizerFiles files = resolve_tokenizer(flag(a, "--tokenizer", "gpt2"));
    const ChatFormatter formatter(chat_template_for(flag(a, "--chat-template", ""), files), files);
    const std::string text = formatter.render(messages, has_switch(a, "--add-generation-prompt"), extra);
    if (has_switch(a, "--text")) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
    std::string out;
    for (int32_t id : load_tokenizer(files)->encode(text)) out += std::to_string(id) + '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(flag(a, "--tokenizer", "gpt2"));
  if (has_switch(a, "--decode")) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos < input.size()) {
      while (pos < input.size() && std::isspace(static_cast<unsigned char>(input[pos]))) pos++;
      if (pos == input.size()) break;
      size_t end = pos;
      while (end < input.size() && !std::isspace(static_cast<unsigned char>(input[end]))) end++;
      const std::string word = input.substr(pos, end - pos);
      ANVIL_CHECK(word.find_first_not_of("0123456789") == std::string::npos && word.size() < 10,
                  "'{}' is not a token id (expected non-negative integers)", word);
      ids.push_back(std::stoi(word));
      pos = end;
    }
    const std::string text = tok->decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::string out;
  for (int32_t id : tok->encode(input)) out += std::to_string(id) + '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int cmd_generate(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kGenerateHelp, stdout), 0;
  Args a = parse_args(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed",
                             "--tokenizer", "--system", "--chat-template"}, {"--chat"},
                      kGenerateHelp);
  if (a.positional.size() != 1) usage_error("generate needs exactly one checkpoint", kGenerateHelp);
  GenerateOptions opt;
  opt.checkpoint = a.positional[0];
  bool has_prompt = false;
  for (const auto& [k, v] : a.flags) has_prompt |= k == "--prompt";
  if (!has_prompt) usage_error("--prompt TEXT is required", kGenerateHelp);
  opt.prompt = flag(a, "--prompt", "");
  opt.tokenizer = flag(a, "--tokenizer", "");
  opt.max_new_tokens = number_flag(a, "--max-new-tokens", 64, kGenerateHelp);
  opt.temperature = number_flag(a, "--temperature", 0.8, kGenerateHelp);
  opt.top_k = number_flag(a, "--top-k", 40, kGenerateHelp);
  opt.top_p = number_flag(a, "--top-p", 1.0, kGenerateHelp);
  opt.seed = number_flag<uint64_t>(a, "--seed", 0, kGenerateHelp);
  opt.chat = has_switch(a, "--chat");
  opt.system = flag(a, "--system", "");
  opt.chat_template = flag(a, "--chat-template", "");
  if (!opt.chat && (!opt.system.empty() || !opt.chat_template.empty()))
    usage_error("--system and --chat-template go with --chat", kGenerateHelp);
  const std::string text = generate_text(opt);
  std::printf("%s\n", text.c_str());
  return 0;
}

int cmd_eval(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kEvalHelp, stdout), 0;
  Args a = parse_args(args, {"--data", "--split", "--max-samples", "--batch", "--icl", "--max-seq-len", "--gauntlet"},
                      {"--json"}, kEvalHelp);
  if (a.positional.size() != 1) usage_error("eval needs exactly one checkpoint", kEvalHelp);
  if (!flag(a, "--icl", "").empty()) {
    for (const char* f : {"--data", "--split", "--max-samples"})
      if (!flag(a, f, "").empty()) usage_error(fmt::format("{} is for loss evaluation, not --icl", f), kEvalHelp);
    IclEvalOptions icl;
    icl.checkpoint = a.positional[0];
    icl.tasks = flag(a, "--icl", "");
    icl.batch = number_flag(a, "--batch", 8, kEvalHelp);
    icl.max_seq_len = number_flag(a, "--max-seq-len", 0, kEvalHelp);
    const bool json = has_switch(a, "--json");
    const std::string gauntlet_file = flag(a, "--gauntlet", "");
    // The gauntlet file is read first: its errors before the model's time.
    std::optional<GauntletSpec> gauntlet;
    if (!gauntlet_file.empty()) gauntlet = read_gauntlet(gauntlet_file);
    const std::vector<IclScore> scores = evaluate_icl(icl);
    for (const IclScore& s : scores) {
      if (json)
        std::printf("{\"task\": %s, \"metric\": \"%s\", \"accuracy\": %.9g, \"n\": %lld}\n",
                    nlohmann::json(s.task).dump().c_str(), s.metric.c_str(), s.accuracy, static_cast<long long>(s.questions));
      else
        std::printf("%-40s %-40s %8.4f  (%lld questions)\n", s.task.c_str(), s.metric.c_str(), s.accuracy,
                    static_cast<long long>(s.questions));
    }
    if (gauntlet) {
      const Gauntlet g = eval_gauntlet(*gauntlet, scores);
      for (const std::string& d : g.dropped) std::fprintf(stderr, "gauntlet: left out category %s\n", d.c_str());
      for (const auto* list : {&g.categories, &g.averages})
        for (const GauntletScore& s : *list) {
          if (json)
            std::printf("{\"gauntlet\": %s, \"score\": %.9g}\n", nlohmann::json(s.name).dump().c_str(), s.score);
          else
            std::printf("gauntlet %-72s %8.4f\n", s.name.c_str(), s.score);
        }
    }
    return 0;
  }
  if (!flag(a, "--max-seq-len", "").empty() || has_switch(a, "--json") || !flag(a, "--gauntlet", "").empty())
    usage_error("--max-seq-len, --gauntlet and --json go with --icl", kEvalHelp);
  EvalOptions opt;
  opt.checkpoint = a.positional[0];
  opt.data = flag(a, "--data", "");
  if (opt.data.empty()) usage_error("--data DIR is required", kEvalHelp);
  opt.split = flag(a, "--split", "val");
  opt.max_samples = number_flag<int64_t>(a, "--max-samples", 0, kEvalHelp);
  opt.batch = number_flag(a, "--batch", 8, kEvalHelp);
  const EvalResult r = evaluate_checkpoint(opt);
  std::printf("eval loss %.6f (perplexity %.2f) over %lld samples of %d tokens (%lld targets) of %s/%s\n", r.loss,
              std::exp(r.loss), static_cast<long long>(r.samples), r.seq_len, static_cast<long long>(r.target_tokens),
              opt.data.c_str(), opt.split.c_str());
  std::printf("{\"loss\": %.9g, \"perplexity\": %.9g, \"samples\": %lld, \"target_tokens\": %lld}\n", r.loss,
              std::exp(r.loss), static_cast<long long>(r.samples), static_cast<long long>(r.target_tokens));
  return 0;
}

int cmd_import(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kImportHelp, stdout), 0;
  Args a = parse_args(args, {}, {}, kImportHelp);
  if (a.positional.size() != 2) usage_error("import needs a Hugging Face directory and an output directory", kImportHelp);
  const HfImportResult r = import_hf(a.positional[0], a.positional[1]);
  std::printf("imported %s: %s, %zu tensors%s -> %s\n", a.positional[0].c_str(),
              model_architecture_summary(r.config).c_str(), r.tensors,
              r.skipped.empty() ? "" : fmt::format(" ({} buffers skipped)", r.skipped.size()).c_str(),
              r.checkpoint.c_str());
  return 0;
}

int cmd_export(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kExportHelp, stdout), 0;
  Args a = parse_args(args, {"--dtype", "--max-shard-size", "--tokenizer"}, {"--merge-lora", "--adapter"}, kExportHelp);
  if (a.positional.size() != 2) usage_error("export needs a checkpoint and an output directory", kExportHelp);
  HfExportOptions opt;
  opt.dtype = flag(a, "--dtype", "fp32");
  opt.merge_lora = has_switch(a, "--merge-lora");
  if (has_switch(a, "--adapter")) {
    if (opt.merge_lora) usage_error("--merge-lora and --adapter: give one (a merged model, or PEFT's adapter)", kExportHelp);
    const HfExportResult r = export_peft_adapter(a.positional[0], a.positional[1], opt.dtype);
    std::printf("exported %s: %s, %zu tensors (%.1f MiB, %s)\n", a.positional[1].c_str(), r.architecture.c_str(),
                r.tensors, static_cast<double>(r.bytes) / (1 << 20), opt.dtype.c_str());
    return 0;
  }
  const int64_t shard = parse_bytes(flag(a, "--max-shard-size", "5gb"), "--max-shard-size");
  if (shard <= 0) usage_error("--max-shard-size must be positive", kExportHelp);
  opt.max_shard_bytes = static_cast<uint64_t>(shard);
  opt.tokenizer = flag(a, "--tokenizer", "");
  const HfExportResult r = export_hf(a.positional[0], a.positional[1], opt);
  std::printf("exported %s: %s, %zu tensors in %d safetensors file%s (%.1f MiB, %s)\n", a.positional[1].c_str(),
              r.architecture.c_str(), r.tensors, r.files, r.files == 1 ? "" : "s",
              static_cast<double>(r.bytes) / (1 << 20), opt.dtype.c_str());
  return 0;
}

int cmd_bench_data(const std::vector<std::string>& rest) {
  Args a = parse_args(rest, {"--seq-len", "--batch", "--workers", "--steps", "--cache"}, {}, kBenchHelp);
  if (a.positional.size() != 1) usage_error("bench data needs one dataset location", kBenchHelp);
  BenchDataOptions opt;
  opt.location = a.positional[0];
  opt.cache = flag(a, "--cache", "");
  opt.seq_len = number_flag(a, "--seq-len", 256, kBenchHelp);
  opt.global_batch = number_flag<int64_t>(a, "--batch", 8, kBenchHelp);
  opt.num_workers = number_flag(a, "--workers", 1, kBenchHelp);
  opt.steps = number_flag<int64_t>(a, "--steps", 0, kBenchHelp);
  const BenchDataResult r = bench_data(opt);
  for (const auto& [name, p] : {std::pair{"cold", r.cold}, std::pair{"warm", r.warm}})
    std::printf("%s: %lld batches, %lld tokens in %.3f s: %.0f tokens/s (%.1f MiB downloaded)\n", name,
                static_cast<long long>(p.steps), static_cast<long long>(p.tokens), p.seconds, p.tokens_per_s,
                p.bytes_downloaded / 1048576.0);
  std::printf("{\"cold_tokens_per_s\": %.1f, \"warm_tokens_per_s\": %.1f, \"tokens_per_pass\": %lld, "
              "\"cold_bytes_downloaded\": %lld}\n", r.cold.tokens_per_s, r.warm.tokens_per_s,
              static_cast<long long>(r.warm.tokens), static_cast<long long>(r.cold.bytes_downloaded));
  return 0;
}

int cmd_inspect(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kInspectHelp, stdout), 0;
  if (args.size() != 1) usage_error("inspect needs one checkpoint or run directory", kInspectHelp);
  const LoadedCheckpoint c = load_checkpoint(args[0], /*with_optimizer=*/true, /*show_progress=*/true);
  const ModelConfig& m = c.config;
  std::printf("checkpoint:     %s\n", c.dir.c_str());
  std::printf("format:         anvil-checkpoint version %d, every tensor's checksum verified\n", kCheckpointVersion);
  std::printf("shards:         %d, one per rank of the run that saved it\n", c.saved_world_size);
  std::printf("step:           %lld (%lld tokens seen; optimizer steps %lld)\n", static_cast<long long>(c.step),
              static_cast<long long>(c.tokens_seen), static_cast<long long>(c.optimizer_steps));
  std::printf("model:          %s; max_seq_len %d, %zu parameters\n", model_architecture_summary(m).c_str(),
              m.max_seq_len, c.params.size());
  if (m.has_lora()) {
    const std::string targets = fmt::format("{}", fmt::join(m.lora.target_modules, ", "));
    std::printf("LoRA:           adapters only (r %d, lora_alpha %g, on %s) of the base %s (weights sha256 %s)\n",
                m.lora.r, static_cast<double>(m.lora.alpha), targets.c_str(), c.lora_base.path.c_str(),
                c.lora_base.weights_sha256.c_str());
  }
  if (c.data_state == "null") {  // anvil import's checkpoints hold weights only
    std::printf("data:           none (weights only: a run that loads it starts its optimizer and data afresh)\n");
  } else {
    const DataState data = DataState::from_json(c.data_state, c.dir + "/manifest.json");
    std::printf("data:           epoch %lld, %lld samples of it consumed, global batch %lld, order %s\n",
                static_cast<long long>(data.epoch), static_cast<long long>(data.sample_in_epoch),
                static_cast<long long>(data.global_batch), data.fingerprint.c_str());
  }
  std::printf("weights sha256: %s\n", weights_sha256(m, c.params.data()).c_str());
  return 0;
}

int cmd_bench_comm(const std::vector<std::string>& rest) {
  Args a = parse_args(rest, {"--min-bytes", "--max-bytes"}, {}, kBenchHelp);
  if (!a.positional.empty()) usage_error("bench comm takes no positional arguments", kBenchHelp);
  auto bytes_flag = [&](const char* name, const char* fallback) {
    const std::string v = flag(a, name, fallback);
    return parse_bytes(v, name);
  };
  const int64_t lo = bytes_flag("--min-bytes", "8"), hi = bytes_flag("--max-bytes", "256mb");
  std::unique_ptr<Communicator> comm = make_communicator(/*require_mpi=*/true);
  const std::vector<BenchCommRow> rows = bench_comm(*comm, static_cast<size_t>(lo), static_cast<size_t>(hi));
  if (comm->rank() != 0) return 0;
  std::printf("all-reduce on %d ranks (%d on this host), %s\n", comm->size(), comm->local_size(), comm->backend().c_str());
  std::printf("%12s  %-18s  %6s  %12s  %10s  %10s\n", "bytes", "algorithm", "iters", "time (us)", "algbw GB/s",
              "busbw GB/s");
  for (const BenchCommRow& r : rows)
    std::printf("%12zu  %-18s  %6d  %12.1f  %10.3f  %10.3f\n", r.bytes, r.algo.c_str(), r.iters, r.seconds * 1e6,
                r.algbw, r.busbw);
  std::printf("ring busbw / MPI_Allreduce busbw:\n");
  for (size_t i = 0; i + 3 < rows.size(); i += 4)
    std::printf("%12zu  %.2f\n", rows[i].bytes, rows[i].busbw / rows[i + 3].busbw);
  for (const BenchCommRow& r : rows)
    std::printf("{\"bytes\": %zu, \"algo\": \"%s\", \"ranks\": %d, \"iters\": %d, \"seconds\": %.9f, \"algbw_gbps\": %.4f, "
                "\"busbw_gbps\": %.4f}\n", r.bytes, r.algo.c_str(), comm->size(), r.iters, r.seconds, r.algbw, r.busbw);
  return 0;
}

int cmd_bench_gemm(const std::vector<std::string>& rest) {
  Args a = parse_args(rest, {"--rounds", "--seconds"}, {}, kBenchHelp);
  if (!a.positional.empty()) usage_error("bench gemm takes no positional arguments", kBenchHelp);
  const int rounds = number_flag(a, "--rounds", 3, kBenchHelp);
  const double seconds = number_flag(a, "--seconds", 0.3, kBenchHelp);
  if (rounds < 1 || !(seconds > 0)) usage_error("bench gemm needs --rounds >= 1 and --seconds > 0", kBenchHelp);
  const std::vector<BenchGemmRow> rows = bench_gemm(rounds, seconds);
  const CpuInfo& cpu = cpu_info();
  std::printf("CPU matrix products, %d threads: %s beside %s\n", cpu.threads,
              matmul_backend_description(KernelImpl::kCpu).c_str(), blas_description().c_str());
  const std::string training = bench_gemm_bf16_training_isa(), onednn_missing = bench_gemm_onednn_missing();
  const bool onednn = onednn_missing.empty();
  if (!onednn) std::printf("oneDNN not timed: %s\n", onednn_missing.c_str());
  std::printf("GFLOP/s, best of %d alternating rounds of at least %.2f s each; bf16 on each instruction set that "
              "can run it, * the one training uses\n", rounds, seconds);
  std::printf("%-46s %6s %6s %6s  %8s %8s ", "product", "M", "N", "K", "OpenBLAS", "anvil");
  std::vector<std::string> path_names;
  for (const BenchGemmPath& p : rows.front().bf16_paths) {
    path_names.push_back("bf16 " + p.isa + (p.isa == training ? "*" : ""));
    std::printf(" %*s", std::max(8, static_cast<int>(path_names.back().size())), path_names.back().c_str());
  }
  if (onednn) std::printf("  %8s %11s", "oneDNN", "oneDNN bf16");
  std::printf("  %6s %6s\n", "ratio", "bf16");
  for (const BenchGemmRow& r : rows) {
    std::printf("%-46s %6d %6d %6d  %8.1f %8.1f ", r.name.c_str(), r.M, r.N, r.K, r.openblas, r.anvil_fp32);
    for (size_t p = 0; p < r.bf16_paths.size(); p++)
      std::printf(" %*.1f", std::max(8, static_cast<int>(path_names[p].size())), r.bf16_paths[p].gflops);
    if (onednn) std::printf("  %8.1f %11.1f", r.onednn_fp32, r.onednn_bf16);
    std::printf("  %6.2f %6.2f\n", r.anvil_fp32 / r.openblas, r.anvil_bf16 / r.openblas);
  }
  for (const BenchGemmRow& r : rows) {
    std::string paths;
    for (const BenchGemmPath& p : r.bf16_paths)
      paths += fmt::format("{}\"{}\": {:.2f}", paths.empty() ? "" : ", ", p.isa, p.gflops);
    std::printf("{\"product\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"openblas_gflops\": %.2f, "
                "\"anvil_fp32_gflops\": %.2f, \"anvil_bf16_gflops\": %.2f, \"anvil_bf16_isa\": \"%s\", "
                "\"bf16_gflops_by_isa\": {%s}%s}\n",
                r.name.c_str(), r.M, r.N, r.K, r.openblas, r.anvil_fp32, r.anvil_bf16, training.c_str(),
                paths.c_str(),
                onednn ? fmt::format(", \"onednn_fp32_gflops\": {:.2f}, \"onednn_bf16_gflops\": {:.2f}, "
                                     "\"onednn_bf16_kernel\": \"{}\"", r.onednn_fp32, r.onednn_bf16,
                                     r.onednn_bf16_kernel).c_str()
                       : "");
  }
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "train" && args[0] != "data" && args[0] != "comm" && args[0] != "gemm")) {
    if (wants_help(args)) return std::fputs(kBenchHelp, stdout), 0;
    usage_error("bench needs a subcommand: train, data, comm or gemm" +
                    (args.empty() ? std::string() : did_you_mean(args[0], {"train", "data", "comm", "gemm"})),
                kBenchHelp);
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (wants_help(rest)) return std::fputs(kBenchHelp, stdout), 0;
  if (args[0] == "data") return cmd_bench_data(rest);
  if (args[0] == "comm") return cmd_bench_comm(rest);
  if (args[0] == "gemm") return cmd_bench_gemm(rest);
  Args a = parse_args(rest, {"--steps", "--warmup"}, {"--profile"}, kBenchHelp);
  if (a.positional.empty()) usage_error("bench train needs a config file", kBenchHelp);
  const std::vector<std::string> overrides(a.positional.begin() + 1, a.positional.end());
  for (const auto& o : overrides)
    if (o.find('=') == std::string::npos) usage_error("'" + o + "' is not a key=value override", kBenchHelp);
  const TrainConfig cfg = load_train_config(a.positional[0], overrides);
  const int steps = number_flag(a, "--steps", 10, kBenchHelp), warmup = number_flag(a, "--warmup", 2, kBenchHelp);
  const bool profile = std::find(a.switches.begin(), a.switches.end(), "--profile") != a.switches.end();
  const BenchTrainResult r = bench_train(cfg, warmup, steps, profile);
  if (r.rank > 0) return 0;  // rank 0 reports for the ranks sharing the model
  if (profile) {
    std::printf("time per step by op (%d steps of %.1f ms):\n", steps, r.step_ms);
    double in_ops = 0;
    for (const OpTime& t : r.profile) {
      const double ms = t.ms / steps;
      in_ops += ms;
      std::printf("  %-32s %9.2f ms %6.1f%% %8lld calls\n", t.op.c_str(), ms, 100 * ms / r.step_ms,
                  static_cast<long long>(t.calls / steps));
    }
    std::printf("  %-32s %9.2f ms %6.1f%%\n", "(outside the ops)", r.step_ms - in_ops, 100 * (r.step_ms - in_ops) / r.step_ms);
  }
  std::printf("tokens/s:        %.1f\n", r.tokens_per_s);
  if (r.steps_run_again > 0)
    std::printf("                 (%d of the %d timed steps ran twice: their gradients outgrew the fixed-point scale; "
                "a larger --warmup leaves them out)\n", r.steps_run_again, steps);
  std::printf("achieved:        %.1f GFLOP/s\n", r.gflops);
  std::printf("measured peak:   %.1f GFLOP/s (%s, %s matrix products)\n", r.peak_gflops, r.peak_source.c_str(),
              choice_name(cfg.precision));
  std::printf("MFU:             %.1f%%\n", 100 * r.mfu);
  std::printf("peak memory:     %.0f MiB (activations %.0f MiB, microbatch %d)\n", r.peak_rss_mib, r.activation_mib,
              r.microbatch);
  std::printf("model states:    %.1f MiB (parameters, gradients, optimizer)%s\n", r.model_states_mib,
              r.frozen_base_mib > 0 ? fmt::format(" + LoRA's frozen base {:.1f} MiB = {:.1f} MiB", r.frozen_base_mib,
                                                  r.model_states_mib + r.frozen_base_mib).c_str() : "");
  if (r.gpu_peak_mib > 0) std::printf("peak GPU memory: %.0f MiB (anvil's allocator)\n", r.gpu_peak_mib);
  if (r.ranks > 1) {
    std::string layout;
    if (r.tensor_parallel > 1) layout = fmt::format("tensor parallel {}", r.tensor_parallel);
    if (r.expert_parallel > 1)
      layout = fmt::format("expert parallel {} (all-to-all {:.2f} MiB a step)", r.expert_parallel, r.all_to_all_mib);
    if (r.pipeline_parallel > 1)
      layout += fmt::format("{}{} pipeline stages (1F1B bubble {:.0f}%)", layout.empty() ? "" : ", ",
                            r.pipeline_parallel, 100 * r.bubble);
    std::printf("%s: %d ranks share the model; memory per rank:\n", layout.c_str(), r.ranks);
    for (size_t k = 0; k < r.per_rank.size(); k++)
      std::printf("  rank %zu: peak %.0f MiB, activations %.1f MiB, model states %.1f MiB\n", k,
                  r.per_rank[k].peak_rss_mib, r.per_rank[k].activation_mib, r.per_rank[k].model_states_mib);
  }
  std::printf("%s\n", bench_train_json(cfg, r, steps).c_str());
  return 0;
}

int cmd_plot(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kPlotHelp, stdout), 0;
  std::vector<std::string> rest = args;
  for (std::string& a : rest)
    if (a == "-o") a = "--out";
  Args a = parse_args(rest, {"--out", "--size"}, {}, kPlotHelp);
  if (a.positional.empty()) usage_error("plot needs at least one run directory", kPlotHelp);
  const std::string size = flag(a, "--size", "1000x600");
  int width = 0, height = 0;
  if (std::sscanf(size.c_str(), "%dx%d", &width, &height) != 2 || width < 100 || height < 100 || width > 10000 ||
      height > 10000)
    usage_error("--size expects WIDTHxHEIGHT in pixels (100 to 10000 each), got '" + size + "'", kPlotHelp);
  std::vector<LossCurve> runs;
  for (const std::string& dir : a.positional) runs.push_back(read_loss_curve(dir));
  const std::string out = flag(a, "--out", "loss.png");
  plot_loss_curves(runs, out, width, height);
  std::printf("%s: %zu run%s\n", out.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

int cmd_submit(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kSubmitHelp, stdout), 0;
  Args a = parse_args(args, {"--nodes", "--tasks-per-node", "--gpus-per-node", "--time", "--partition", "--account",
                             "--signal-seconds"}, {"--dry-run"}, kSubmitHelp);
  if (a.positional.empty()) usage_error("submit needs a config file", kSubmitHelp);
  std::vector<std::string> overrides(a.positional.begin() + 1, a.positional.end());
  for (const std::string& o : overrides)
    if (o.find('=') == std::string::npos) usage_error("'" + o + "' is not a key=value override", kSubmitHelp);
  overrides.push_back("autoresume=true");  // a requeued job continues from its newest checkpoint
  TrainConfig cfg = load_train_config(a.positional[0], overrides);
  cfg.run_dir = fs::absolute(cfg.run_dir).lexically_normal().string();
  SubmitOptions opt;
  opt.nodes = number_flag(a, "--nodes", 1, kSubmitHelp);
  opt.tasks_per_node = number_flag(a, "--tasks-per-node", 1, kSubmitHelp);
  opt.gpus_per_node = number_flag(a, "--gpus-per-node", 0, kSubmitHelp);
  opt.signal_seconds = number_flag(a, "--signal-seconds", 120, kSubmitHelp);
  opt.time = flag(a, "--time", "");
  opt.partition = flag(a, "--partition", "");
  opt.account = flag(a, "--account", "");
  opt.anvil_path = fs::read_symlink("/proc/self/exe").string();
  const std::string config_path = cfg.run_dir + "/job.yaml", script_path = cfg.run_dir + "/job.sbatch";
  const std::string script = sbatch_script(cfg, config_path, opt);
  if (!a.switches.empty()) return std::fputs(script.c_str(), stdout), 0;  // --dry-run
  make_dirs(cfg.run_dir);
  write_file_atomic(config_path, to_yaml(cfg));
  write_file_atomic(script_path, script);
  FILE* p = popen(fmt::format("sbatch --parsable '{}' 2>&1", script_path).c_str(), "r");
  ANVIL_CHECK(p, "cannot run sbatch");
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  ANVIL_CHECK(status == 0, "sbatch {} failed{}: {}", script_path,
              WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (is SLURM's client, slurm-client, installed?)" : "",
              out);
  const std::string job = out.substr(0, out.find(';'));
  std::printf("submitted job %s: %s\nlog: %s/slurm-%s.out\n", job.c_str(), script_path.c_str(), cfg.run_dir.c_str(),
              job.c_str());
  return 0;
}

int cmd_doctor(const std::vector<std::string>& args) {
  if (wants_help(args)) return std::fputs(kDoctorHelp, stdout), 0;
  if (!args.empty()) usage_error("doctor takes no arguments", kDoctorHelp);
  return run_doctor();
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") return std::puts("anvil 0.1.0"), 0;
  // Every subcommand, once: dispatch and the "did you mean" of a mistyped one both read it.
  using Command = int (*)(const std::vector<std::string>&);
  static constexpr std::pair<const char*, Command> kCommands[] = {
      {"train", cmd_train},       {"doctor", cmd_doctor}, {"data", cmd_data},
      {"tokenize", cmd_tokenize}, {"generate", cmd_generate}, {"export", cmd_export},
      {"import", cmd_import},     {"eval", cmd_eval},     {"inspect", cmd_inspect},
      {"bench", cmd_bench},       {"plot", cmd_plot},     {"submit", cmd_submit}};
  const std::string cmd = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  std::vector<std::string> names = {"help"};
  for (const auto& [name, run] : kCommands) {
    if (cmd == name) return run(rest);
    names.push_back(name);
  }
  usage_error("unknown command '" + cmd + "'" + did_you_mean(cmd, names), kUsage);
}

}  // namespace
}  // namespace anvil

int main(int argc, char** argv) {
  anvil::blas_select_kernels(argv);
  try {
    return anvil::dispatch(argc, argv);
  } catch (const anvil::Error& e) {
    anvil::end_job_on_error(e.what());
    anvil::log_line(anvil::LogLevel::kError, e.what());
    return 1;
  } catch (const std::exception& e) {
    anvil::end_job_on_error(std::string("internal error: ") + e.what());
    anvil::log_line(anvil::LogLevel::kError, std::string("internal error: ") + e.what());
    return 2;
  }
}
