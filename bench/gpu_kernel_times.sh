#!/usr/bin/env bash
# Every GPU kernel of anvil's training steps timed on the device by Nsight Compute (ncu, one
# metric: gpu__time_duration), summed by kernel name, largest first: which cuBLASLt products, which
# flash attention kernels, which element-wise passes take the step's time. `anvil bench train
# --profile` times ops; this names the kernels inside them (a product's tile shape, split-K
# reductions). ncu serialises the kernels, so the sums are device time without overlap.
# Usage: bench/gpu_kernel_times.sh OUT_CSV [anvil bench train arguments...]
#        (default: GPT-2 124M, sequence 1024, batch 8, amp_bf16, deterministic_mode=false, 1 step)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ $# -ge 1 ] || { echo "usage: bench/gpu_kernel_times.sh OUT_CSV [anvil bench train arguments...]" >&2; exit 2; }
csv="$1"
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(configs/bench-124m.yaml kernels=gpu deterministic_mode=false max_seq_len=1024
  model.max_seq_len=1024 global_train_batch_size=8 device_train_microbatch_size=8 precision=amp_bf16)
command -v ncu > /dev/null || { echo "no ncu (Nsight Compute) on the PATH" >&2; exit 1; }
# anvil bench marks its timed steps for profilers (cudaProfilerStart/Stop): ncu collects one step
# after a warm-up, nothing of the set-up or the peak-rate products.
ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base --clock-control none \
  build/cuda-release/bin/anvil bench train "${args[@]}" --steps 1 --warmup 1 > "$csv" 2> "$csv.stderr" ||
  { tail -5 "$csv.stderr"; exit 1; }
python3 - "$csv" <<'EOF'
import collections, csv, re, sys
# anvil's own lines come first in the file; ncu's table starts at its header.
rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
head = rows[start]
rows = [head] + [r for r in rows[start + 1:] if len(r) == len(head)]
name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
unit = head.index("Metric Unit")
total = collections.defaultdict(float)
calls = collections.Counter()
for r in rows[1:]:
    if r[metric] != "gpu__time_duration.sum":
        continue
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}[r[unit]]
    k = re.sub(r"\(.*", "", r[name])[:90]
    total[k] += float(r[value].replace(",", "")) * scale
    calls[k] += 1
all_ms = sum(total.values())
print(f"device time per step, by kernel ({all_ms:.2f} ms in all, ncu-serialised):")
for k, ms in sorted(total.items(), key=lambda kv: -kv[1])[:40]:
    print(f"  {ms:8.3f} ms {100 * ms / all_ms:5.1f}% {calls[k]:5d} calls  {k}")
EOF
