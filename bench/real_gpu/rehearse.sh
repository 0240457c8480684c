#!/usr/bin/env bash
# The CPU rehearsal of the lab run (issue 50), here, before any device time: everything
# lab_run.sh does on the GPU machine, from the carried folders (.carry1..N, as built by
# `python -m bench.real_gpu.build_parts`), up to the servers (RG_DRY=1): the parts unpacked with
# unzstd.py and the carried zstandard wheel, the venvs and the port trees, the carried pyinfra
# and specfleet's facts through the interpreter the server runs with, the plans and rendered
# units of every server. Stand-ins, each named as one: nvidia-smi (tests/harness/
# standin_nvidia_smi.py replaying tests/fixtures/nvidia/$RG_NVIDIA_PROFILE, default h200x2: the
# repository's H200 capture), the image's site-packages (RG_IMAGE_SITE: the image's pure-Python
# packages the run imports, installed here; no torch), and, while the lab pair is not in the
# checkout, lab_placeholders.py's files. Scratch in $R (default /tmp/rehearse-lab); the carried
# folders are read, never moved.
#
#   bash bench/real_gpu/rehearse.sh            # then read $R/work/summary.json, run.log
#
# The DDTree run (issue 51) the same way: RG_LAB_SCRIPT names its script, RG_CARRY its carried
# folders (a prefix: PREFIX1 .. PREFIXN), RG_IMAGE_NEEDS its list of the image's packages, or
# RG_IMAGE_SITE a folder of them made already (read, not changed):
#
#   R=/tmp/rehearse-ddtree RG_LAB_SCRIPT=bench/real_gpu/ddtree/lab_ddtree.sh \
#     RG_CARRY=build/real_gpu_ddtree/carry/carry bash bench/real_gpu/rehearse.sh
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
R=${R:-/tmp/rehearse-lab}
PY312=${PY312:-python3.12}
$PY312 -c 1 2>/dev/null || PY312=$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)
$PY312 -c 'import sys; assert sys.version_info[:2] == (3, 12)' || { echo "rehearse: no Python 3.12 (set PY312)"; exit 1; }
rm -rf "$R/work" "$R/venvs" "$R/links" "$R/parts" "$R/carry"
mkdir -p "$R/bin" "$R/parts" "$R/carry" "$R/links"
SCRIPT=${RG_LAB_SCRIPT:-bench/real_gpu/lab_run.sh}
CP=${RG_CARRY:-$REPO/.carry}; case $CP in /*) ;; *) CP=$REPO/$CP ;; esac
N=$(ls -d "$CP"[0-9]* 2>/dev/null | sed "s|^$CP||" | sort -n | tail -1)
[ -n "$N" ] || { echo "rehearse: no $CP<N> folders: python -m bench.real_gpu.build_parts"; exit 1; }
for i in $(seq 1 $((N - 1))); do ln "$CP$i"/* "$R/parts/" 2>/dev/null || cp "$CP$i"/* "$R/parts/"; done
cp "$CP$N"/* "$R/carry/"
# STAND-IN nvidia-smi: the repository's replay of a real capture.
cat > "$R/bin/nvidia-smi" <<EOF
#!/bin/sh
# STAND-IN for nvidia-smi (the CPU rehearsal): tests/harness/standin_nvidia_smi.py replaying
# tests/fixtures/nvidia/${RG_NVIDIA_PROFILE:-h200x2}.
STANDIN_NVIDIA_SMI_PROFILE=$REPO/tests/fixtures/nvidia/${RG_NVIDIA_PROFILE:-h200x2} STANDIN_NVIDIA_SMI_RUNTIME=$R/standin-run exec python3 -IS $REPO/tests/harness/standin_nvidia_smi.py "\$@"
EOF
chmod +x "$R/bin/nvidia-smi"
# STAND-IN for the image's site-packages: the image's packages (KINDS.md's list) that the carried
# set needs and build_parts therefore left out, for Python 3.12; no torch.
NEEDS=${RG_IMAGE_NEEDS:-$REPO/build/real_gpu/image-needs.txt}  # by build_parts: not carried
IMAGE=${RG_IMAGE_SITE:-$R/image}
if [ -z "${RG_IMAGE_SITE:-}" ] && ! cmp -s "$NEEDS" "$R/image/.done"; then
  rm -rf "$R/image"
  $PY312 -m pip install -q --target "$R/image" --no-compile -r "$NEEDS" && cp "$NEEDS" "$R/image/.done"
fi
# The lab pair: the checkout's, else PLACEHOLDERS (said in the log and the record).
if [ -f "$REPO/bench/real_gpu/lab/reference.json" ] && [ -d "$REPO/bench/real_gpu/models/lab-target" ]; then
  echo "rehearse: the lab pair of the checkout"
else
  echo "rehearse: PLACEHOLDER lab files (bench/real_gpu/lab_placeholders.py): the pair is not in this checkout"
  python3 "$REPO/bench/real_gpu/lab_placeholders.py" "$R/lab-placeholders"
  export RG_LAB_DIR=$R/lab-placeholders/lab RG_LAB_MODELS=$R/lab-placeholders/models
fi
cd "$REPO"
PATH="$R/bin:$PATH" RG_DRY=1 RG_WORK=$R/work OUT=$R/out RG_PARTS=$R/parts CARRY=$R/carry \
  RG_VENV_ROOT=$R/venvs RG_IMAGE_PYTHON=$PY312 RG_IMAGE_SITE=$IMAGE RG_LINK_ROOT=$R/links \
  bash $SCRIPT
rc=$?
# What the server would fail to import (the image's torch, triton, torchvision are not here).
SP=$(echo $R/venvs/sglang/lib/python3*/site-packages)
for v in "$R"/venvs/sglang "$R"/venvs/sglang-port-*; do
  [ -d "$v" ] || continue  # no port trees (the DDTree run)
  echo "import scan: $(basename $v)"
  python3 bench/real_gpu/import_scan.py $(echo $v/lib/python3*/site-packages) "$SP" "$IMAGE" \
    --image torch triton torchvision torchaudio | grep -v '^conditional' || rc=4
done
# What the rehearsal rendered outside $R (the units and env files of drive.render_unit, at the
# deploy's paths; no systemd here): removed, by their names.
# The lab's S1..S10; the DDTree run's P0, D0, F<budget>, T<budget>-lab-drafter*.
for t in 'S[0-9]*' P0 D0 'F[0-9]*' 'T[0-9]*-lab-drafter*'; do
  for f in /etc/systemd/system/specfleet-$t.service /etc/specfleet/specfleet-$t.env; do
    [ -f "$f" ] && rm -f "$f"
  done
  rm -rf /etc/specfleet/specfleet-$t.logging
done
echo "rehearse: rc $rc; record and summary in $R/work (record.json or ddtree-record.json)"
exit $rc
