#!/bin/bash
# The steady step of benchmarks/programs/liger_moe_step.py on one GPU with the run of
# autotune_capture (its second call, 2026-12-03) loaded by `sweep exec`, against the same
# program with the configs Triton's own autotune picked in that call (pinned.py), interleaved
# ours, triton, triton, ours, ours, triton. Logs under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
R=/tmp/autotune-capture-gc_6yivi/liger_moe; mkdir -p $R && tar xzf benchmarks/results/autotune_capture_runs/liger_moe-run2-2026-12-03.tar.gz -C $R
export TRITON_CACHE_DIR=/tmp/tc; P="benchmarks/programs/liger_moe_step.py --tokens 256,1024 --experts 8"
PICKS=benchmarks/results/autotune_capture_runs/liger_triton_picks-2026-12-03.json
for arm in ours triton triton ours ours triton; do
  t0=$(date +%s.%N)
  if [ $arm = ours ]; then python3 -m sweep exec $R/run -- python3 $P > $OUT/$arm.out 2>$OUT/$arm.err; else python3 benchmarks/programs/pinned.py $PICKS $P > $OUT/$arm.out 2>$OUT/$arm.err; fi
  echo "$arm rc=$? $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s" | tee -a $OUT/steady.log
  grep '^{' $OUT/$arm.out | sed "s/^/$arm /" >> $OUT/steady.jsonl
done
