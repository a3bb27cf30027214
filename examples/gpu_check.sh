#!/usr/bin/env bash
# The GPU check of the CUDA extension, for a session that has a GPU (target: under 6 minutes on an H200).
#
#   OUT=/tmp/gpu_out bash examples/gpu_check.sh
#
# Installs kvcalc (editable, no dependency downloads), builds the extension for this GPU's architecture
# (ptxas report kept), runs `pytest -m cuda`, compute-sanitizer memcheck and racecheck on a small case,
# `kvcalc bench --device cuda --json`, `kvcalc verify --device cuda --dtype bf16 --json` and, while time
# is left, examples/gpu_diag.py (diag.json).
# Everything goes under $OUT; a short table is printed last.
# A step that fails is recorded and the script goes on; the exit status is 1 if any step failed.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export KVCALC_CACHE_DIR="${KVCALC_CACHE_DIR:-$OUT/cache}"
STATUS="$OUT/status.txt"
: >"$STATUS"
FAILED=0

# step NAME TIMEOUT_S COMMAND... : runs COMMAND with a time limit, output to $OUT/NAME.log, records rc.
step() {
  local name="$1" limit="$2"
  shift 2
  local start=$SECONDS rc
  echo "== $name (limit ${limit}s)" >&2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  printf '%-12s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >>"$STATUS"
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    tail -n 5 "$OUT/$name.log" >&2
  fi
  return 0
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /'
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /'
  nvcc --version 2>/dev/null | tail -n 1 | sed 's/^/nvcc: /'
  python3 -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda)' 2>/dev/null
} >"$OUT/environment.txt"

ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')"
ARCH="${ARCH:-90}"

step install 120 python3 -m pip install --no-deps --no-build-isolation -e .
step build 180 python3 - "$ARCH" <<'EOF'
import sys

from kvcalc.cuda_ext.build import build_library

result = build_library([sys.argv[1]])
print(f"library: {result.library_path}\ncached: {result.cached}\ncompile_s: {result.compile_s:.1f}")
for k in result.kernels:
    print(f"{k.arch} {k.registers:3d} regs stack {k.stack_bytes} spill {k.spill_store_bytes}/{k.spill_load_bytes} {k.name}")
sys.exit(1 if any(k.spills for k in result.kernels) else 0)
EOF
step pytest_cuda 150 python3 -m pytest -q -m cuda -rs tests/cuda_ext

# A small case for the sanitizers: paged and contiguous, split and unsplit, ragged lengths incl. 0.
cat >"$OUT/small_case.py" <<'EOF'
import torch

from kvcalc.cuda_ext import ops
from kvcalc.cuda_ext.bench import make_inputs

gen = torch.Generator(device="cuda").manual_seed(0)
for dtype, head_dim, block_size in ((torch.bfloat16, 128, 16), (torch.float16, 64, 1), (torch.float16, 256, 256)):
    x = make_inputs([0, 5, 300, 1000], 16, 2, head_dim, block_size, dtype, "cuda", gen)
    for splits in (1, 3):
        ops.paged_decode_attention(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens"],
                                   num_splits=splits)
        ops.contiguous_decode_attention(x["q"], x["k"], x["v"], x["seq_lens"], num_splits=splits)
torch.cuda.synchronize()
print("small case done")
EOF
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 "$OUT/small_case.py"
  if [ "$SECONDS" -lt 200 ]; then
    step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 "$OUT/small_case.py"
  else
    echo "racecheck    skipped (time budget)" >>"$STATUS"
  fi
else
  echo "memcheck     skipped (compute-sanitizer not found)" >>"$STATUS"
fi

step bench 150 kvcalc bench --device cuda --sweep-block --json --save "$OUT/bench.json"
# The model decoded through the pool with the CUDA kernel as its decode attention (bf16: the top-k rule).
step verify 90 sh -c "kvcalc verify --device cuda --dtype bf16 --json > '$OUT/verify.json'"
# Diagnostics for tuning (group / split / layout sweeps: memory- or issue-bound?), only while time is left.
if [ "$SECONDS" -lt 290 ]; then
  step diag 60 python3 examples/gpu_diag.py "$OUT" --budget-s 40
else
  echo "diag         skipped (time budget)" >>"$STATUS"
fi

cat "$OUT/environment.txt"
cat "$STATUS"
if [ -s "$OUT/bench.json" ]; then
  python3 - "$OUT/bench.json" <<'EOF'
import json
import sys

doc = json.load(open(sys.argv[1]))
checks = doc["correctness"]
print(f"correctness: {sum(r['passed'] for r in checks)}/{len(checks)} passed, max rel err "
      f"{max(r['rel_err'] for r in checks):.2e}; paged vs contiguous: {doc['paged_vs_contiguous']['explanation']}")
print(f"copy ceiling: {doc['copy_tbps']:.3f} TB/s")
print(f"{'batch':>5} {'ctx':>6} {'blk':>4} {'paged us':>9} {'contig us':>9} {'p/c':>6} {'TB/s':>6} {'%copy':>6} {'sdpa us':>8}")
for r in doc["timing"] + doc.get("block_sweep", []):
    sdpa = f"{r['sdpa_us']:8.1f}" if r.get("sdpa_us") else "       -"
    print(f"{r['batch']:5d} {r['context']:6d} {r['block_size']:4d} {r['paged_us']:9.1f} {r['contiguous_us']:9.1f} "
          f"{r['paged_over_contiguous']:6.3f} {r['achieved_tbps']:6.3f} {100 * r['fraction_of_copy']:5.1f}% {sdpa}")
EOF
fi
if [ -s "$OUT/diag.json" ]; then
  tail -n 20 "$OUT/diag.log"
fi
echo "total: ${SECONDS}s; logs in $OUT"
exit "$FAILED"
