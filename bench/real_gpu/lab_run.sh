#!/usr/bin/env bash
# The lab pair's GPU run (issue 50), as one command on the borrowed H200 machine, from the
# repository root there. Expects the parts (*.tar.zst.NN: kernel, site312) in /root/parts (the
# earlier calls moved them there: `python -m bench.real_gpu.build_parts` prints the calls) and
# $CARRY (the run call's folder: the zstandard wheel, port-*.tar.gz + port-trees.json from
# build_port_trees.py, COMMIT). Writes $OUT/real_gpu.tar.gz (record.json, summary.json, server
# logs, plans), refreshed every 20 s so that a call cut short still returns what it did, and
# $OUT/run.log.
#
# A second call on the same warm machine goes on where the first stopped: the venvs are kept
# (/opt/specfleet/.lab-setup-done), lab_run.py resumes from its record. RG_ONLY=S1,S2 limits the
# servers. RG_DRY=1: facts, plans and units only (the CPU rehearsal: bench/real_gpu/rehearse.sh).
# RG_RUNNER: the script run with the venv's Python after the setup (default lab_run.py;
# bench/real_gpu/ddtree/lab_ddtree.sh names lab_ddtree.py, with its own parts and RG_VENV_ROOT).
set -u
RUNNER=${RG_RUNNER:-bench/real_gpu/lab_run.py}
C=${CARRY:-.carry5}
FAILED=0
fail() { echo "FAILED: $*"; FAILED=$((FAILED + 1)); }
# The lab pair must be in the tree (merged): else stop now, before the setup's minutes.
LABD=${RG_LAB_DIR:-bench/real_gpu/lab}; MODD=${RG_LAB_MODELS:-bench/real_gpu/models}
for f in $LABD/reference.json $LABD/probe.json $MODD/lab-target/config.json $MODD/lab-target/tokenizer.json $MODD/lab-drafter/config.json; do
  [ -f "$f" ] || { echo "lab_run.sh: $f is not in this tree: merge the lab pair (issue 49) first"; exit 2; }
done
[ -n "${RG_DRY:-}" ] || ls $MODD/lab-target/*.safetensors >/dev/null 2>&1 || { echo "lab_run.sh: no safetensors in $MODD/lab-target"; exit 2; }
P=${RG_PARTS:-/root/parts}
mkdir -p $P && mv $C/*.tar.zst.* $P/ 2>/dev/null
W=${RG_WORK:-/tmp/real_gpu}; mkdir -p "$W"; export RG_WORK=$W
exec > >(tee -a "$W/run.log") 2>&1
OUTDIR=${OUT:-$W/out}; mkdir -p "$OUTDIR"
pack() { tar -C "$(dirname "$W")" -czf "$OUTDIR/.p.tgz" "$(basename "$W")" 2>/dev/null && mv "$OUTDIR/.p.tgz" "$OUTDIR/real_gpu.tar.gz"; cp "$W/run.log" "$OUTDIR/run.log" 2>/dev/null; }
( while sleep 20; do pack; done ) & PACKER=$!
export RG_COMMIT=$(cat $C/COMMIT 2>/dev/null || git rev-parse HEAD)
echo "=== call at $(date -u +%FT%TZ) commit $RG_COMMIT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PY=${RG_IMAGE_PYTHON:-python3}
# The image's site-packages (torch 2.11.0+cu130 and the rest of the image); the rehearsal names a
# stand-in folder instead (RG_IMAGE_SITE: no torch where no GPU is).
T=${RG_IMAGE_SITE:-$($PY -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')}
echo "torch $($PY -c 'import torch;print(torch.__version__)' 2>&1 | tail -1) in $T"
ls -la $P $C

# --- venvs: stock 0.5.11 and the port trees (fixed, stale-mask, unfixed; rope where built) ---
V=${RG_VENV_ROOT:-/opt/specfleet}; mkdir -p $V
SP=$V/sglang/lib/python3.12/site-packages
unz() { PYTHONPATH=/tmp/zs $PY bench/real_gpu/unzstd.py "$@"; }
base_pth() { printf "import site; site.addsitedir('%s')\nimport site; site.addsitedir('%s')\n" "$SP" "$T" > "$1/zz-base.pth"; }
TREES=$(cd $C && ls port-*.tar.gz 2>/dev/null | sed 's/^port-//; s/\.tar\.gz$//')
if [ ! -f $V/.lab-setup-done ]; then
  mkdir -p /tmp/zs && $PY -m zipfile -e $C/zstandard-*.whl /tmp/zs
  $PY -m venv --without-pip $V/sglang
  SP=$(echo $V/sglang/lib/python3*/site-packages)
  ( set -o pipefail; unz $P/kernel.tar.zst.* | tar -C $SP -x ) & KJOB=$!
  ( set -o pipefail; unz $P/site312.tar.zst.* | tar -C $SP -x ) || fail "site312 unpack"
  echo "import site; site.addsitedir('$T')" > $SP/zz-image-torch.pth
  for kind in $TREES; do
    $PY -m venv --without-pip $V/sglang-port-$kind
    PSP=$(echo $V/sglang-port-$kind/lib/python3*/site-packages)
    cp -a $SP/sglang $SP/sglang-0.5.11.dist-info $PSP/ && tar -C $PSP -xzf $C/port-$kind.tar.gz || fail "port tree $kind"
    base_pth $PSP
  done
  wait $KJOB || fail "kernel unpack"
  [ $FAILED = 0 ] && touch $V/.lab-setup-done
else
  echo "setup kept from an earlier call"
fi
SP=$(echo $V/sglang/lib/python3*/site-packages)
# Each venv's imports, once per machine and side by side (run 6: about 25 s a venv, one after the
# other, 146 s of a call's setup even where the venvs were kept).
if [ ! -f $V/.versions ]; then
  JOBS=""
  for v in sglang $(for k in $TREES; do echo sglang-port-$k; done); do
    ( echo "$v: $($V/$v/bin/python -c 'import sglang,transformers,sgl_kernel;print(sglang.__version__, sglang.__file__, transformers.__version__)' 2>&1 | tail -1)" > $V/.version-$v ) &
    JOBS="$JOBS $!"
  done
  wait $JOBS  # these alone: a bare wait would wait on the packer, which never ends
  cat $V/.version-* > $V/.versions
fi
cat $V/.versions
for kind in $TREES; do
  for f in speculative/dflash_utils.py models/dflash.py; do
    echo "port $kind $f sha256: $(sha256sum $V/sglang-port-$kind/lib/python3*/site-packages/sglang/srt/$f | cut -c1-12)"
  done
done
echo "setup done at $SECONDS s"; pack

# --- the servers and checks ($RUNNER: lab_run.py, or lab_ddtree.py) ---
export VENV_STOCK=$V/sglang VENV_FIXED=$V/sglang-port-fixed VENV_STALE_MASK=$V/sglang-port-stale-mask VENV_UNFIXED=$V/sglang-port-unfixed
[ -d $V/sglang-port-rope ] && export VENV_ROPE=$V/sglang-port-rope
export REAL_GPU_BUDGET_S=$(( ${RG_BUDGET:-585} - SECONDS ))
PYTHONPATH=$PWD PYTHONUNBUFFERED=1 $V/sglang/bin/python $RUNNER
RC=$?
kill $PACKER 2>/dev/null; pack
echo "all done at $SECONDS s ($(basename $RUNNER) rc $RC, $FAILED setup failures)"
[ $FAILED = 0 ] && exit $RC || exit 3
