#!/usr/bin/env bash
# The DDTree sweep's GPU run (issue 51) as one command on the borrowed H200 machine, from the
# repository root there: bench/real_gpu/lab_run.sh's setup and call (the parts of /root/parts-ddtree
# unpacked into a venv with the carried zstandard wheel, the image's torch 2.11.0+cu130 added
# through a .pth, $OUT/real_gpu.tar.gz packed every 20 s, run.log, a second call on the warm
# machine keeping the venv), with the fork's parts of bench/real_gpu/ddtree/build_parts.py
# (kernel: sglang-kernel 0.4.3; site312: the fork's set, its python/sglang laid under
# sglang-0.0.0.dev0.dist-info), its own venv root (not the 0.5.11 lab's) and lab_ddtree.py as
# the runner. Its record: $RG_WORK/ddtree-record.json (resumable; a point with outputs is kept).
#
#   CARRY=.ddcarryN bash bench/real_gpu/ddtree/lab_ddtree.sh     # build_parts.py prints the calls
#
# RG_DRY=1: facts, plans and units only (the CPU rehearsal: RG_LAB_SCRIPT=bench/real_gpu/ddtree/
# lab_ddtree.sh bash bench/real_gpu/rehearse.sh). RG_ONLY=P0,T4-lab-drafter: only those servers.
set -u
export RG_VENV_ROOT=${RG_VENV_ROOT:-/opt/specfleet-ddtree}
# Its parts have the 0.5.11 lab's names: their own folder, so that both can be on one machine.
export RG_PARTS=${RG_PARTS:-/root/parts-ddtree}
export RG_WORK=${RG_WORK:-/tmp/real_gpu_ddtree}
export RG_RUNNER=bench/real_gpu/ddtree/lab_ddtree.py
export RG_RECORD=ddtree-record.json
# Resumable across machines: a fresh machine's first run call goes on from the record of an
# earlier session's last call, its $OUT/real_gpu.tar.gz put in the run call's folder.
PREV=${RG_RESUME_FROM:-${CARRY:-.ddcarry}/real_gpu.tar.gz}
if [ -f "$PREV" ] && [ ! -f "$RG_WORK/$RG_RECORD" ]; then
  mkdir -p "$RG_WORK" && tar -C "$RG_WORK" --strip-components=1 -xzf "$PREV" \
    && echo "lab_ddtree.sh: resumed from $PREV ($(cd "$RG_WORK" && ls | tr '\n' ' '))"
fi
exec bash "$(dirname "$0")/../lab_run.sh"
