#!/bin/sh
# The lab pair from nothing (issue 49): the schedule that made the committed files.
# Run from the repository root with the lab's environment (README.md here): sh bench/real_gpu/lab/rebuild.sh
set -eu
PY=${PY:-/tmp/labenv/bin/python}
L=bench/real_gpu/lab
export OMP_NUM_THREADS=1
# the target: 500 steps on periods 4-12, then on periods 4-8 until the induction holds
$PY $L/train_pair.py --stage target --target-steps 500 --target-batch 16 --target-lr 2e-3 --max-seg 12
$PY $L/train_pair.py --stage target --resume --target-steps 400 --target-batch 12 --target-lr 2e-3
$PY $L/train_pair.py --stage target --resume --seed 51 --target-steps 450 --target-batch 12 --target-lr 1.5e-3
# the drafters on the target's greedy continuations
$PY $L/train_pair.py --stage drafters --drafter-steps 300 --weak-steps 100
# prompts, probe, the reference DFlash loop; 0.5.11's loading replayed; the stale mask emulated
$PY $L/reference.py
$PY $L/replay_load.py
$PY $L/stale_mask.py
python3 $L/pairfiles.py write
