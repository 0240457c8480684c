#!/usr/bin/env bash
# The real-GPU run (issues 39 and 30), as one command on the borrowed H200 machine, from the
# repository root there. Expects the carried parts in /root/parts (earlier calls moved them there:
# see bench/real_gpu/README.md) and .carry/ (zstandard wheel, port tarballs, the gate branch's gate).
# Writes $OUT/real_gpu.tar.gz (everything: record.json, server logs, plans, verdicts), refreshed
# every 20 s so that a run cut short still returns what it did, and $OUT/run.log.
set -u; S23=/nonexistent
C=${CARRY:-.carry3}
mkdir -p /root/parts && mv $C/*.tar.zst.* /root/parts/ 2>/dev/null
W=/tmp/real_gpu; mkdir -p "$W"; export RG_WORK=$W
exec > >(tee "$W/run.log") 2>&1
pack() { tar -C /tmp -czf "$OUT/.p.tgz" real_gpu 2>/dev/null && mv "$OUT/.p.tgz" "$OUT/real_gpu.tar.gz"; cp "$W/run.log" "$OUT/run.log" 2>/dev/null; }
( while sleep 20; do pack; done ) & PACKER=$!
echo "date $(date -u +%FT%TZ) commit $(cat $C/COMMIT 2>/dev/null || git rev-parse HEAD)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
T=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "torch $(python3 -c 'import torch;print(torch.__version__)') in $T"

# --- venvs: the stock 0.5.11 tree, the port trees (unfixed, fixed), 0.5.23 (ServerArgs only) ---
mkdir -p /tmp/zs && python3 -m zipfile -e $C/zstandard-*.whl /tmp/zs
unz() { PYTHONPATH=/tmp/zs python3 bench/real_gpu/unzstd.py "$@"; }
V=/opt/specfleet; mkdir -p $V
python3 -m venv --without-pip $V/sglang
SP=$V/sglang/lib/python3.12/site-packages
( unz /root/parts/kernel.tar.zst.* | tar -C $SP -x || echo "FAILED: kernel unpack" ) & KJOB=$!
unz /root/parts/site312.tar.zst.* | tar -C $SP -x || echo "FAILED: site unpack"
# 0.5.11 imports gguf (quantization/gguf.py) and flashinfer (layers/attention/vision.py, through
# http_server's transcription adapters) at the top of modules the server loads.
for whl in $C/gguf-*.whl $C/flashinfer_python-*.whl $C/apache_tvm_ffi-*.whl $C/nvidia_cudnn_frontend-*.whl $C/cuda_tile-*.whl; do
  [ -f "$whl" ] && python3 -m zipfile -e "$whl" $SP
done
echo "import site; site.addsitedir('$T')" > $SP/zz-image-torch.pth
for kind in unfixed fixed; do
  python3 -m venv --without-pip $V/sglang-port-$kind
  PSP=$V/sglang-port-$kind/lib/python3.12/site-packages
  cp -a $SP/sglang $PSP/ && tar -C $PSP -xzf $C/port-$kind.tar.gz
  printf "import site; site.addsitedir('%s')\nimport site; site.addsitedir('%s')\n" "$SP" "$T" > $PSP/zz-base.pth
done
[ -n "${RG_ONLY_A:-}" ] || {
python3 -m venv --without-pip $V/sglang-0523
S23=$V/sglang-0523/lib/python3.12/site-packages
( unz /root/parts/site523.tar.zst.* | tar -C $S23 -x || echo "FAILED: 0.5.23 unpack" ) & SJOB=$!
}
wait $KJOB ${SJOB:-}
printf "import site; site.addsitedir('%s')\nimport site; site.addsitedir('%s')\n" "$SP" "$T" > $S23/zz-base.pth
# The plan's model paths, linked to the tiny configs (dummy weights).
mkdir -p /srv/models/moonshotai--Kimi-K2.6 /srv/models/z-lab--Kimi-K2.6-DFlash
ln -sfn "$PWD/bench/real_gpu/models/tiny-target" /srv/models/moonshotai--Kimi-K2.6/current
ln -sfn "$PWD/bench/real_gpu/models/tiny-drafter" /srv/models/z-lab--Kimi-K2.6-DFlash/current
for v in sglang sglang-port-unfixed sglang-port-fixed sglang-0523; do
  echo "$v: $($V/$v/bin/python -c 'import sglang,transformers,sgl_kernel;print(sglang.__version__, sglang.__file__, transformers.__version__)' 2>&1 | tail -1)"
done
echo "setup done at $SECONDS s"; pack

# --- C (issue 30): every plan through the real ServerArgs, in the background (CPU only) ---
K2="--target-dir $PWD/bench/real_gpu/models/k2-target --drafter-dir $PWD/bench/real_gpu/models/k2-drafter --weights-bytes 602133487616"
[ -n "${RG_ONLY_A:-}" ] || (
  cd bench/real_gpu
  $V/sglang/bin/python serverargs_check.py --plans plans.json --builds 0.5.11 --release 0.5.11 $K2 > $W/verdicts-0.5.11.jsonl 2> $W/verdicts-0.5.11.err
  $V/sglang-port-fixed/bin/python serverargs_check.py --plans plans.json --builds pr20547 --release "0.5.11+pr20547-port-fixed" $K2 > $W/verdicts-pr20547.jsonl 2> $W/verdicts-pr20547.err
  $V/sglang-0523/bin/python serverargs_check.py --plans plans.json --builds 0.5.23 --release 0.5.23 $K2 > $W/verdicts-0.5.23.jsonl 2> $W/verdicts-0.5.23.err
  echo "C done at $SECONDS s: $(cat $W/verdicts-*.jsonl | wc -l) verdicts"
) &
CJOB=$!

# --- A and B (issue 39): servers from the plan's unit, the gate, greedy comparisons ---
export VENV_STOCK=$V/sglang VENV_UNFIXED=$V/sglang-port-unfixed VENV_FIXED=$V/sglang-port-fixed
export PROBE_GATE=$PWD/$C/readiness_gate_probe.py
export REAL_GPU_BUDGET_S=$(( ${RG_BUDGET:-585} - SECONDS ))
PYTHONPATH=$PWD PYTHONUNBUFFERED=1 $V/sglang/bin/python bench/real_gpu/drive.py
[ -n "${RG_ONLY_A:-}" ] || wait $CJOB
kill $PACKER 2>/dev/null; pack
echo "all done at $SECONDS s"
