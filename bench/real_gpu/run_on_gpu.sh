#!/usr/bin/env bash
# The real-GPU run (issues 39, 30, 40), as one command on the borrowed H200 machine, from the
# repository root there. Expects the carried parts (*.tar.zst.NN) in /root/parts (earlier calls
# moved them there: see bench/real_gpu/README.md) and $CARRY (default .carry3: the zstandard
# wheel, gguf and flashinfer_python with its needs, the port tarballs from build_port_trees.py,
# COMMIT). Writes $OUT/real_gpu.tar.gz (record.json, server logs, plans, verdicts), refreshed
# every 20 s so that a run cut short still returns what it did, and $OUT/run.log.
#
# A second call on the same warm machine goes on where the first stopped: the venvs are kept
# (/opt/specfleet/.setup-done), drive.py resumes from its record, a finished verdict file is kept.
# RG_ONLY=A or B limits drive.py's runs; RG_NO_C=1 skips the ServerArgs check (C).
set -u
C=${CARRY:-.carry3}
mkdir -p /root/parts && mv $C/*.tar.zst.* /root/parts/ 2>/dev/null
W=/tmp/real_gpu; mkdir -p "$W"; export RG_WORK=$W
exec > >(tee -a "$W/run.log") 2>&1
pack() { tar -C /tmp -czf "$OUT/.p.tgz" real_gpu 2>/dev/null && mv "$OUT/.p.tgz" "$OUT/real_gpu.tar.gz"; cp "$W/run.log" "$OUT/run.log" 2>/dev/null; }
( while sleep 20; do pack; done ) & PACKER=$!
export RG_COMMIT=$(cat $C/COMMIT 2>/dev/null || git rev-parse HEAD)
echo "=== call at $(date -u +%FT%TZ) commit $RG_COMMIT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
T=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "torch $(python3 -c 'import torch;print(torch.__version__)') in $T"
ls -la /root/parts

# --- venvs: stock 0.5.11; the port trees (unfixed, stale-mask, fixed); 0.5.23 and 0.5.14 ---
V=/opt/specfleet; mkdir -p $V
SP=$V/sglang/lib/python3.12/site-packages
unz() { PYTHONPATH=/tmp/zs python3 bench/real_gpu/unzstd.py "$@"; }
base_pth() { printf "import site; site.addsitedir('%s')\nimport site; site.addsitedir('%s')\n" "$SP" "$T" > "$1/zz-base.pth"; }
if [ ! -f $V/.setup-done ]; then
  mkdir -p /tmp/zs && python3 -m zipfile -e $C/zstandard-*.whl /tmp/zs
  python3 -m venv --without-pip $V/sglang
  ( unz /root/parts/kernel.tar.zst.* | tar -C $SP -x || echo "FAILED: kernel unpack" ) & KJOB=$!
  unz /root/parts/site312.tar.zst.* | tar -C $SP -x || echo "FAILED: site unpack"
  # 0.5.11 imports gguf (quantization/gguf.py) and flashinfer (layers/attention/vision.py,
  # through http_server's transcription adapters) at the top of modules the server loads.
  for whl in $C/gguf-*.whl $C/flashinfer_python-*.whl $C/apache_tvm_ffi-*.whl $C/nvidia_cudnn_frontend-*.whl $C/cuda_tile-*.whl; do
    [ -f "$whl" ] && python3 -m zipfile -e "$whl" $SP
  done
  echo "import site; site.addsitedir('$T')" > $SP/zz-image-torch.pth
  for kind in unfixed stale-mask fixed; do
    python3 -m venv --without-pip $V/sglang-port-$kind
    PSP=$V/sglang-port-$kind/lib/python3.12/site-packages
    cp -a $SP/sglang $SP/sglang-0.5.11.dist-info $PSP/ && tar -C $PSP -xzf $C/port-$kind.tar.gz || echo "FAILED: port tree $kind"
    base_pth $PSP
  done
  for rel in 523 514; do
    python3 -m venv --without-pip $V/sglang-0$rel
    RSP=$V/sglang-0$rel/lib/python3.12/site-packages
    if ls /root/parts/site$rel.tar.zst.* >/dev/null 2>&1; then
      unz /root/parts/site$rel.tar.zst.* | tar -C $RSP -x || echo "FAILED: $rel unpack"
    else
      echo "NOT CARRIED: site$rel"
    fi
    base_pth $RSP
  done
  wait $KJOB
  # The plan's model paths, linked to the tiny configs (dummy weights).
  mkdir -p /srv/models/moonshotai--Kimi-K2.6 /srv/models/z-lab--Kimi-K2.6-DFlash
  ln -sfn "$PWD/bench/real_gpu/models/tiny-target" /srv/models/moonshotai--Kimi-K2.6/current
  ln -sfn "$PWD/bench/real_gpu/models/tiny-drafter" /srv/models/z-lab--Kimi-K2.6-DFlash/current
  touch $V/.setup-done
else
  echo "setup kept from an earlier call"
fi
for v in sglang sglang-port-unfixed sglang-port-stale-mask sglang-port-fixed sglang-0523 sglang-0514; do
  echo "$v: $($V/$v/bin/python -c 'import sglang,transformers,sgl_kernel;print(sglang.__version__, sglang.__file__, transformers.__version__)' 2>&1 | tail -1)"
done
for kind in unfixed stale-mask fixed; do
  echo "port $kind dflash_utils.py sha256: $(sha256sum $V/sglang-port-$kind/lib/python3.12/site-packages/sglang/srt/speculative/dflash_utils.py | cut -c1-12)"
done
echo "setup done at $SECONDS s"; pack

# --- C (issues 30, 40): every plan through each release's real ServerArgs, in the background ---
K2="--target-dir $PWD/bench/real_gpu/models/k2-target --drafter-dir $PWD/bench/real_gpu/models/k2-drafter --weights-bytes 602133487616"
check() {  # venv build label
  local out=$W/verdicts-$3.jsonl
  [ -s $out ] && [ -f $out.done ] && { echo "C $3: kept"; return; }
  (cd bench/real_gpu && $V/$1/bin/python serverargs_check.py --plans plans.json --builds $2 --release "$3" $K2 > $out 2> $W/verdicts-$3.err) && touch $out.done
  echo "C $3 done at $SECONDS s: $(wc -l < $out) verdicts"
}
if [ -z "${RG_NO_C:-}" ]; then
  ( check sglang 0.5.11 0.5.11
    check sglang-port-fixed pr20547 0.5.11+pr20547-port-fixed
    check sglang-0523 0.5.23 0.5.23
    check sglang-0514 0.5.14 0.5.14 ) &
  CJOB=$!
fi

# --- A and B (issue 39): servers from the plan's unit, the gate, greedy comparisons ---
export VENV_STOCK=$V/sglang VENV_UNFIXED=$V/sglang-port-unfixed VENV_STALE_MASK=$V/sglang-port-stale-mask VENV_FIXED=$V/sglang-port-fixed
export REAL_GPU_BUDGET_S=$(( ${RG_BUDGET:-585} - SECONDS ))
PYTHONPATH=$PWD PYTHONUNBUFFERED=1 $V/sglang/bin/python bench/real_gpu/drive.py
[ -n "${CJOB:-}" ] && wait $CJOB
kill $PACKER 2>/dev/null; pack
echo "all done at $SECONDS s"
