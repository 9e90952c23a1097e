#!/usr/bin/env bash
# The GPU sprint (issues 30 and 40), in steps that each fit one device command (under 9 minutes on
# one H100/H200). A lent GPU now gives about 15 minutes in all, so one call of `next` is the plan:
#
#   bash tools/gpu_sprint.sh pack                  # here, on the CPU: data, wheels, source -> .gpu/; releases/ hidden
#   bash tools/gpu_sprint.sh next                  # on the GPU (device tool: carry .gpu, limit ~560 s)
#   python tools/sprint_pack.py unpack OUT         # here: the results in the repository, releases/ restored
#   bash tools/gpu_sprint.sh restore               # here: releases/ back without unpacking anything
#   bash tools/gpu_sprint.sh --rehearse next       # the same plan on the CPU, tiny sizes
#   python tools/sprint_plan.py --show             # what the next calls will do
#
# Steps:
#   pack     copy the parquet folders the next call trains on (`sprint_plan.py --datasets`: cifar100
#            first, 21 MB each; cifar10, which check and measure read, when the plan trains nothing) and
#            the wheels the GPU image lacks (datasets and what it needs that the image does not hold)
#            into .gpu/, an ignored
#            folder the device tool carries, and record the code the tree is at in .gpu/source.json
#            (commit, sha256 of `git diff HEAD`; refused when hscl_zoo/, recipes/, benchmarks/, tools/
#            differ from HEAD: a measurement names its code). First it hides releases/ (the committed
#            weights, over the 64 MiB a call carries, read by no call) in .releases-hidden/, an ignored
#            folder the call does not carry (`sprint_pack.py hide`: refused, nothing moved, when
#            releases/ differs from HEAD; hidden already: nothing to do).
#   restore  put releases/ back from .releases-hidden/, byte for byte (`sprint_pack.py restore`; `unpack`
#            does it first). Nothing hidden: nothing to do.
#   next     tools/sprint_next.py: from the committed files (results/gpu-cifar10/runs, the GPU
#            check results), the most valuable missing work that fits the call (tools/sprint_plan.py):
#            two missing runs side by side (the gpu-cifar100 row at seed 0, H-SCL(beta) first; then
#            gpu-cifar10's missing seed-0 releases; then seeds 1 and 2), each seed-0 run released in
#            bf16; with 4 minutes left, the step-parity
#            check (TF32 off and on) and the loss-memory benchmark. Every result is packed into $OUT
#            as it lands (results.tgz, weights as <= 15 MiB tar parts), so a cut call keeps what
#            finished; `python tools/sprint_pack.py unpack OUT` puts them in the repository.
#   check    environment, CPU-vs-device parity (benchmarks/cuda_parity.py), and two epochs of
#            hscl-beta-cifar10 whose second epoch is trained again from the first's checkpoint.
#   measure  benchmarks/loss_bench.py and benchmarks/train_throughput.py (ResNet-18 and ResNet-50,
#            small stem, plain and fast, compile, augmentation alone, loss memory).
#   overlap  ResNet-18's compute-only, end-to-end and end-to-end-overlapped rates on the packed
#            CIFAR-100, then one gpu-cifar100 run (UCL, seed 0) alone, its seconds outside training
#            itemised in its record.
#
# check, measure and overlap land in $STATE/results/ (STATE: runs/gpu-sprint, or runs/gpu-sprint-rehearsal),
# and each part of them packs the results and logs so far into $OUT/<step>.tgz (OUT: the device
# tool's folder; $STATE/out when unset). A step whose result file exists is skipped.
# Exit status: the number of failed parts (0: all passed).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REHEARSE=0
STEPS=()
ARGS=("$@")
for arg in "$@"; do
  case $arg in
    --rehearse) REHEARSE=1 ;;
    pack|restore|next|check|measure|overlap) STEPS+=("$arg") ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$arg'; steps are pack, restore, next, check, measure, overlap (and --rehearse)." >&2; exit 2 ;;
  esac
done
[ ${#STEPS[@]} -gt 0 ] || { echo "error: name at least one step: pack, restore, next, check, measure or overlap (see --help)." >&2; exit 2; }

PACK=.gpu
WHEELS="datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0"
if [ $REHEARSE = 1 ]; then
  STATE=${STATE:-runs/gpu-sprint-rehearsal}; DEVICE=cpu
else
  STATE=${STATE:-runs/gpu-sprint}; DEVICE=cuda
fi
OUT=${OUT:-$STATE/out}
DATA=${DATA:-$PACK/data}
RES=$STATE/results
LOGS=$STATE/logs
FAILED=0
PY=${PYTHON:-python3}

note() { echo "[gpu_sprint $(date -u +%H:%M:%S)] $*"; }

# run NAME RESULT_FILE CMD...: skip when RESULT_FILE exists, log to $LOGS/NAME.log, count a failure.
run() {
  local name=$1 result=$2; shift 2
  if [ -n "$result" ] && [ -s "$result" ]; then note "$name: done before ($result)"; return 0; fi
  note "$name: $*"
  local started=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOGS/$name.log"
  note "$name: exit $rc after $((SECONDS - started)) s"
  [ $rc = 0 ] || FAILED=$((FAILED + 1))
  pack_out
  return $rc
}

setup() {
  [ -d "$DATA" ] || { echo "error: no data folder at $DATA; run 'bash tools/gpu_sprint.sh pack' first or set DATA to the folder holding cifar10/ and cifar100/." >&2; exit 3; }
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  if [ $REHEARSE = 0 ] && compgen -G "$PACK/whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-sprint-site \
      "$PACK"/whl/*.whl || { echo "error: installing $PACK/whl failed" >&2; exit 3; }
    export PYTHONPATH=/tmp/gpu-sprint-site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
  fi
  # the device's copy of the tree may hold no .git or a stale one (seen on the first H100): name the packed commit
  if [ $REHEARSE = 0 ] && [ -s $PACK/source_commit ]; then
    HSCL_ZOO_SOURCE_COMMIT=$(cat $PACK/source_commit); export HSCL_ZOO_SOURCE_COMMIT
  fi
  mkdir -p "$RES" "$LOGS" "$OUT"
}

step_pack() {
  if [ $REHEARSE = 0 ] && [ -n "$(git status --porcelain -- hscl_zoo recipes benchmarks tools)" ]; then
    echo "error: hscl_zoo/, recipes/, benchmarks/ or tools/ differ from HEAD; commit first, so the results name their code." >&2; exit 2
  fi
  local shared=${SHARED_DATA:-../shared/data} names name
  "$PY" tools/sprint_pack.py hide --into "$ROOT" || exit 2
  names=$(PYTHONPATH=$ROOT "$PY" tools/sprint_plan.py --datasets) || { echo "error: the plan failed" >&2; exit 2; }
  rm -rf $PACK/data
  for name in ${names:-cifar10}; do
    [ -d "$shared/$name" ] || { echo "error: no $shared/$name to pack; set SHARED_DATA to the folder holding it." >&2; exit 2; }
    mkdir -p $PACK/data/$name
    cp "$shared/$name"/*.parquet $PACK/data/$name/
  done
  mkdir -p $PACK/whl
  if [ $REHEARSE = 0 ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d $PACK/whl $WHEELS || { echo "error: downloading the wheels failed" >&2; exit 2; }
  fi
  git rev-parse HEAD > $PACK/source_commit
  PYTHONPATH=tools "$PY" -c "import json, pathlib, sprint_pack; print(json.dumps(sprint_pack.source(pathlib.Path('.'))))" \
    > $PACK/source.json || { echo "error: recording the source in $PACK/source.json failed" >&2; exit 2; }
  du -sh $PACK
  note "pack: carry '$PACK' in the device tool's call"
}

step_check() {
  run env "$RES/env.json" "$PY" - "$RES/env.json" <<'EOF'
import json, subprocess, sys, importlib, platform
info = {"python": platform.python_version()}
for name in ("torch", "torchvision", "timm", "accelerate", "datasets", "pyarrow", "safetensors", "huggingface_hub", "numpy"):
    try:
        info[name] = importlib.import_module(name).__version__
    except Exception as error:
        info[name] = f"missing: {error}"
import torch
info["cuda_available"] = torch.cuda.is_available()
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
    info["cuda"] = torch.version.cuda
    info["cudnn"] = torch.backends.cudnn.version()
    info["bf16_supported"] = torch.cuda.is_bf16_supported()
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except OSError:
    info["nvidia_smi"] = None
import hscl_zoo
info["hscl_zoo"] = hscl_zoo.__version__
print(json.dumps(info, indent=2))
open(sys.argv[1], "w").write(json.dumps(info, indent=2) + "\n")
EOF
  run parity "$RES/parity.json" "$PY" benchmarks/cuda_parity.py --device $DEVICE --json "$RES/parity.json"

  local dir=$STATE/resume-check small=()
  [ $REHEARSE = 1 ] && small=(--backbone resnet18 --subset 64 --batch_size 32 --mixed_precision no --num_workers 0
                                --probe_epochs 2 --monitor_train_size 64 --knn_k 20)  # two steps an epoch prove the resume
  if [ ! -s "$RES/resume.json" ]; then
    if [ ! -s "$STATE/resume-first.jsonl" ]; then
      rm -rf "$dir"
      run resume-first "" "$PY" -m accelerate.commands.launch --num_processes 1 --num_machines 1 --mixed_precision no \
        --dynamo_backend no recipes/pretrain.py --config hscl-beta-cifar10 --data_dir "$DATA/cifar10" --epochs 2 \
        "${small[@]}" --output_dir "$dir" && cp "$dir/metrics.jsonl" "$STATE/resume-first.jsonl"
    fi
    if [ -s "$STATE/resume-first.jsonl" ]; then
      rm -rf "$dir/checkpoints/epoch_0002"
      run resume-second "" "$PY" -m accelerate.commands.launch --num_processes 1 --num_machines 1 --mixed_precision no \
        --dynamo_backend no recipes/pretrain.py --output_dir "$dir" --resume \
        && run resume-compare "$RES/resume.json" "$PY" - "$STATE/resume-first.jsonl" "$dir/metrics.jsonl" "$RES/resume.json" <<'EOF'
import json, sys
first = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
second = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
a, b = first[-1]["train_loss"], second[-1]["train_loss"]
gap = abs(a - b) / abs(a)
result = {"epoch": first[-1]["epoch"], "train_loss_uninterrupted": a, "train_loss_resumed": b, "relative_gap": gap,
          "tolerance": 1e-2, "ok": gap <= 1e-2, "epochs_in_resumed_log": len(second),
          "views_per_second": [h.get("views_per_second") for h in first]}
print(json.dumps(result, indent=2))
open(sys.argv[3], "w").write(json.dumps(result, indent=2) + "\n")
sys.exit(0 if result["ok"] and len(second) == len(first) else 1)
EOF
    fi
  else
    note "resume: done before ($RES/resume.json)"
  fi
}

step_measure() {
  local bench=() tp=() compile_tp=() mem=(--memory-batches 512 1024 2048 4096)
  if [ $REHEARSE = 1 ]; then
    bench=(--batch-sizes 32 --reruns 1 --repeats 2 --reference-max-batch 32)
    local tiny=(--batch-size 4 --steps 1 --warmup 1 --rows 64 --workers 0)  # bf16 on a CPU: the smallest batch proves the command
    tp=(--backbones resnet18 "${tiny[@]}")
    compile_tp=(--backbones resnet10t "${tiny[@]}")  # the rehearsal proves the flags: the smallest ResNet compiles fastest
    mem=(--memory-batches 32 64)
  else
    bench=(--batch-sizes 512,2048,8192 --reruns 3 --repeats 5 --iters-per-sync 5)
    tp=(--backbones resnet18 resnet50 --workers 12)
    compile_tp=(--backbones resnet50 --workers 12)
  fi
  run loss-bench "$RES/loss.json" "$PY" benchmarks/loss_bench.py --device $DEVICE "${bench[@]}" --json "$RES/loss.json"
  run throughput "$RES/throughput.json" "$PY" benchmarks/train_throughput.py --device $DEVICE --data-dir "$DATA/cifar10" \
    --losses hscl-beta "${tp[@]}" --channels-last --fused-optim --gpu-augment --cache --bf16 --json "$RES/throughput.json"
  run compile "$RES/compile.json" "$PY" benchmarks/train_throughput.py --device $DEVICE --data-dir "$DATA/cifar10" \
    --losses hscl-beta --no-plain "${compile_tp[@]}" --channels-last --fused-optim --gpu-augment --cache --bf16 --compile \
    --json "$RES/compile.json"
  local aug=()
  [ $REHEARSE = 1 ] && aug=(--repeats 1)
  run augment "$RES/augment.json" "$PY" benchmarks/train_throughput.py --augment-bench --device $DEVICE "${aug[@]}" \
    --json "$RES/augment.json"
  run loss-memory "$RES/loss-memory.json" "$PY" benchmarks/train_throughput.py --loss-memory --device $DEVICE \
    "${mem[@]}" --json "$RES/loss-memory.json"
}

# overlap: the views made one batch ahead, measured (issue 48): ResNet-18 data / compute / e2e /
# e2e-overlap rows on the packed training set, then one run of gpu-cifar100 alone on the device
# (UCL, seed 0), whose record itemises its seconds outside training.
step_overlap() {
  local name=${OVERLAP_DATA:-cifar100} tp=() budget=gpu-cifar100
  if [ $REHEARSE = 1 ]; then
    tp=(--batch-size 4 --steps 1 --warmup 1 --rows 64 --workers 0); budget=gpu-cifar100-rehearsal
  else
    tp=(--batch-size 512 --rows 50000 --workers 12)
  fi
  run overlap "$RES/overlap.json" "$PY" benchmarks/train_throughput.py --device $DEVICE --data-dir "$DATA/$name" --dataset $name \
    --backbones resnet18 --losses hscl-beta --no-plain --channels-last --fused-optim --gpu-augment --cache --bf16 \
    --overlap "${tp[@]}" --json "$RES/overlap.json"
  run solo-run "$RES/ucl-s0.json" bash -c "\"$PY\" recipes/reproduce.py --budget $budget --data_dir '$DATA/cifar100' \
    --seeds 0 --methods ucl --out '$STATE/solo' && cp '$STATE/solo/runs/ucl-s0.json' '$RES/ucl-s0.json'"
}

# next: the planner decides, from the files, what this call does; it packs $OUT itself.
step_next() {
  local args=(--state "$STATE" --out "$OUT" --data "$DATA" --command "bash tools/gpu_sprint.sh $*")
  [ $REHEARSE = 1 ] && args+=(--rehearse)
  [ $REHEARSE = 0 ] && [ -s $PACK/source.json ] && args+=(--source $PACK/source.json)
  [ -n "${VIEW:-}" ] && args+=(--view "$VIEW")
  [ -n "${SPRINT_SECONDS:-}" ] && args+=(--budget-seconds "$SPRINT_SECONDS")
  "$PY" tools/sprint_next.py "${args[@]}"
  FAILED=$((FAILED + $?))
}

# pack_out: $OUT/<step>.tgz holds the step's results and logs so far, so a command cut at the
# device's time limit still brings back what finished.
pack_out() {
  flock "$STATE/.pack.lock" tar czf "$OUT/$STEP.tgz" -C "$STATE" results logs
}

for step in "${STEPS[@]}"; do
  if [ "$step" = pack ]; then step_pack; continue; fi
  if [ "$step" = restore ]; then "$PY" tools/sprint_pack.py restore --into "$ROOT" || exit 2; continue; fi
  STEP=$step
  setup
  if [ "$step" = next ]; then step_next "${ARGS[@]}"; continue; fi
  "step_$step"
  pack_out
  note "$step: packed $OUT/$step.tgz ($(du -h "$OUT/$step.tgz" | cut -f1))"
done
note "finished ${STEPS[*]}: $FAILED failed part(s)"
exit $FAILED
