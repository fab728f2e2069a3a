#!/usr/bin/env bash
# The GPU check: run it once whenever a CUDA GPU is at hand (under 3 minutes on an H200
# before steps 5 and 6 and step 3's decode_graphs were added; those add about 3 more,
# unmeasured yet).
#   1. the CUDA tests (pytest -m cuda);
#   2. training throughput of the WMT14 base model on synthetic 32x32 batches in bf16:
#      target tokens/s and model FLOP utilisation against a bf16 GEMM timed in the run,
#      beside Hugging Face's Marian on the same batches; then on batches twice as large;
#   3. a short Multi30k training on the GPU (300 steps, token batches), then translation speed
#      (greedy and beam 5) with that checkpoint, and where beam search's time goes
#      (benchmarks/profile_decode.py: cold and warm, the GPU's busy share, host-device
#      waits), and cold and warm with SDPA in place of the engine's matmul attention;
#      then test2016 in beam 5 and greedy with the CPU's batch budget, the GPU's, and the
#      GPU's with captured decoder steps (decode_graphs.json);
#   4. that training again with matmul attention, and both trainings' tokens/s (whether
#      cuDNN's attention, with a plan for every new shape, slows training on real batches);
#   5. three epochs of that training with every choice measured on the GPU (attention,
#      batch shapes, CUDA graphs), then with eager updates: each epoch's seconds and ms
#      per update (the first epoch must cost at most 1.5x a later one);
#   6. 200 updates under torchrun with NCCL (world size 1);
#   7. decoding at a known amount of work: a WMT14-base-sized model of random weights,
#      1,024 sources of 24 pieces, every output forced to 24 tokens, greedy and beam 4,
#      eager and with captured steps, beside Hugging Face's generate at its best batch
#      (benchmarks/decode_fixed_length.py).
# Everything lands in $OUT (default gpu_check/): logs and one JSON line per benchmark.
# STEPS (default "1 2 3 4 5 6 7") runs only the steps named; steps 4-6 start from the
# run that step 3 trains, which is then trained whichever of them is named.
# The machine needs torch with CUDA, sentencepiece, typer, sacrebleu, pyyaml, transformers
# and pytest (not datasets: the corpora are text files); mtkit itself runs from this
# checkout (PYTHONPATH), nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=" ${STEPS:-1 2 3 4 5 6 7} "  # STEPS="1 3 7": only those (the whole check may pass 8 min)
want() { [[ $steps == *" $1 "* ]]; }
copy_run() {  # the prepared run directory of step 3, without what training wrote
  mkdir -p "$1" && cp -r "$run"/. "$1"/ && rm -rf "$1"/checkpoints "$1"/metrics.jsonl "$1"/.lock
}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')" \
    || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"

if want 1; then
  echo "== 1. CUDA tests"
  timeout 240 python3 -m pytest -q -n 0 -m cuda -p no:cacheprovider tests 2>&1 | tee "$out/cuda_tests.log"
fi

if want 2; then
  echo "== 2. training throughput, WMT14 base, bf16, synthetic batches"
  timeout 200 python3 benchmarks/train_throughput.py --config configs/wmt14-en-de-base.yaml \
      --synthetic 32 32 --vocab-size 32000 --precision bf16 --device cuda --steps 40 \
      --warmup 8 --compare hf --rounds 2 2>"$out/train_throughput.log" \
      | tee "$out/train_throughput.json"
  timeout 100 python3 benchmarks/train_throughput.py --config configs/wmt14-en-de-base.yaml \
      --synthetic 32 32 --vocab-size 32000 --precision bf16 --device cuda --steps 40 \
      --warmup 8 --set train.max_tokens=25000 2>>"$out/train_throughput.log" \
      | tee -a "$out/train_throughput.json"
fi

if want 3 || want 4 || want 5 || want 6; then  # steps 4-6 start from its run
  echo "== 3. a short Multi30k training on the GPU"
  run=$(mktemp -d)/multi30k
  set_run=(--set "run_dir=$run" --set train.max_time=0 --set train.max_steps=300
           --set train.valid_every=300 --set train.save_every=0 --set train.average_last=0)
  for stage in tokenizer preprocess train; do
    timeout 200 python3 -m mtkit -q "$stage" -c configs/multi30k.yaml "${set_run[@]}" \
        2>&1 | tee -a "$out/multi30k.log" || exit 1
  done
fi
if want 3; then
  echo "== 3. translation speed"
  timeout 150 python3 benchmarks/translate_speed.py -m "$run/checkpoints/best.pt" --device cuda \
      2>"$out/translate_speed.log" | tee "$out/translate_speed.json"
  timeout 120 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
      --limit 300 2>>"$out/translate_speed.log" | tee "$out/profile_decode.json"
  timeout 120 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
      --limit 300 --attention sdpa --no-profile 2>>"$out/translate_speed.log" \
      | tee -a "$out/profile_decode.json"
  # beam search's host reads of which sentences are done: every step (as before the
  # device-side bookkeeping) against every READ_EVERY_ON_GPU steps (the default above)
  timeout 120 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
      --limit 300 --read-every 1 2>>"$out/translate_speed.log" | tee -a "$out/profile_decode.json"
  # all of test2016, beam 5 and greedy, with the CPU's batch budget (8,000, as
  # before), the GPU-sized one, and the GPU-sized one with fixed shapes and captured steps
  # (outputs compared with the eager engine's); greedy over val (1,014 sentences: what a
  # validation decodes) with captured steps
  for beam in 5 1; do
    timeout 90 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
        --beam $beam --batch-tokens 8000 --cuda-graphs off --no-profile \
        2>>"$out/translate_speed.log" | tee -a "$out/decode_graphs.json"
    timeout 90 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
        --beam $beam --cuda-graphs off --no-profile \
        2>>"$out/translate_speed.log" | tee -a "$out/decode_graphs.json"
    timeout 120 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
        --beam $beam --cuda-graphs on --compare-eager \
        2>>"$out/translate_speed.log" | tee -a "$out/decode_graphs.json"
  done
  timeout 90 python3 benchmarks/profile_decode.py -m "$run/checkpoints/best.pt" --device cuda \
      --beam 1 --cuda-graphs on --src data/multi30k/val.en.gz --warmup-src data/multi30k/test2016.en.gz \
      --no-profile 2>>"$out/translate_speed.log" | tee -a "$out/decode_graphs.json"
fi

if want 4; then
  echo "== 4. the same training with matmul attention (step 3's took what auto measured): tokens/s"
  run2=$(mktemp -d)/multi30k
  set_run2=(--set "run_dir=$run2" "${set_run[@]:2}" --set train.attention=matmul)
  for stage in tokenizer preprocess train; do
    timeout 200 python3 -m mtkit -q "$stage" -c configs/multi30k.yaml "${set_run2[@]}" \
        2>&1 | tee -a "$out/multi30k.log" || exit 1
  done
  python3 - "$run" "$run2" <<'PY' 2>&1 | tee -a "$out/multi30k.log"
import json, statistics, sys
for run in sys.argv[1:]:
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    start = next(r for r in records if r["event"] == "start")
    rates = [r["tokens_per_s"] for r in records if r["event"] == "train"]
    print(json.dumps({"attention": start.get("attention"), "precision": start["precision"],
                      "median_tokens_per_s": round(statistics.median(rates)) if rates else None,
                      "train_records": len(rates)}))
PY
fi

if want 5; then
  echo "== 5. the first epoch against later ones, and CUDA graphs against eager updates"
  # Step 3's run, its checkpoints left out, trained 3 epochs twice: with every choice auto
  # (attention and batch shapes measured on the GPU, CUDA graphs where measured faster),
  # and with eager updates (cuda_graphs off). One JSON line each: each epoch's seconds and
  # ms per update, the first epoch over the second (the third ends with a validation), and
  # the choices.
  for graphs in auto off; do
    run3=$(mktemp -d)/multi30k && copy_run "$run3"
    timeout 150 python3 -m mtkit -q train -c configs/multi30k.yaml --set "run_dir=$run3" \
        --set train.max_time=0 --set train.max_steps=0 --set train.max_epochs=3 \
        --set train.valid_every=100000 --set train.save_every=0 --set train.average_last=0 \
        --set train.log_every=50 --set train.attention=auto --set train.batch_shapes=auto \
        --set "train.cuda_graphs=$graphs" 2>&1 | tee -a "$out/epochs.log"
    python3 - "$run3" "$graphs" <<'PY' 2>&1 | tee -a "$out/epochs.json"
import json, sys
records = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
start = next(r for r in records if r["event"] == "start")
marks = [(start["time"], 0)] + [(r["time"], r["step"]) for r in records if r["event"] in ("epoch", "end")]
seconds = [round(b[0] - a[0], 2) for a, b in zip(marks, marks[1:])]
ms = [round(1e3 * (b[0] - a[0]) / max(b[1] - a[1], 1), 2) for a, b in zip(marks, marks[1:])]
print(json.dumps({"benchmark": "epochs", "cuda_graphs": sys.argv[2], "epoch_seconds": seconds,
                  "ms_per_update": ms,
                  "first_over_second": round(seconds[0] / seconds[1], 2) if len(seconds) > 1 else None,
                  "captured_updates": [r.get("captured_updates") for r in records if r["event"] == "train"][-3:],
                  "graph_fallbacks": sum(r["event"] == "graph_fallback" for r in records),
                  "attention": start.get("attention"), "batches": start.get("batches"),
                  "graphs": start.get("graphs")}))
PY
  done
fi

if want 6; then
  echo "== 6. torchrun with NCCL, world size 1 (the multi-node path)"
  run4=$(mktemp -d)/multi30k && copy_run "$run4"
  timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m mtkit -q train \
      -c configs/multi30k.yaml --set "run_dir=$run4" --set train.max_time=0 \
      --set train.max_steps=200 --set train.valid_every=200 --set train.save_every=100 \
      --set train.average_last=0 2>&1 | tee -a "$out/torchrun.log"
  python3 - "$run4" <<'PY' 2>&1 | tee "$out/torchrun.json"
import json, sys
records = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
start, end = records[0], records[-1]
print(json.dumps({"benchmark": "torchrun_nccl", "world_size": start.get("world_size"),
                  "device": start.get("device"), "end": end}))
PY
fi

if want 7; then
  echo "== 7. decoding a WMT14-base-sized model at a fixed length, beside Hugging Face"
  timeout 240 python3 benchmarks/decode_fixed_length.py --device cuda --beams 1,4 \
      2>"$out/decode_fixed_length.log" | tee "$out/decode_fixed_length.json"
fi
