#!/bin/sh
# STAND-IN for nvidia-smi on the test fleet's hosts, in front of standin_nvidia_smi.py: it replays
# what that stand-in answered before to the same arguments (each answer itself a replay of a real
# capture), so that a host's probe does not pay a Python start for each nvidia-smi call (on the
# benchmark machine every host's CPU is the control machine's). New arguments, and compute-apps
# while a test has put GPU processes in place, go to the Python stand-in.
py=/usr/local/lib/standin-nvidia-smi/standin_nvidia_smi.py
run=${STANDIN_NVIDIA_SMI_RUNTIME:-/run/standin-nvidia-smi}
if [ -z "$STANDIN_NVIDIA_SMI_PROFILE" ] && [ ! -e "$run/compute-apps.csv" ]; then
    sum=$(printf '%s\n' "$@" | cksum)
    answer="$run/replay/${sum% *}-${sum#* }"
    if [ -f "$answer.rc" ] && read -r rc < "$answer.rc"; then
        cat "$answer.out"
        if [ -s "$answer.err" ]; then cat "$answer.err" >&2; fi
        exit "$rc"
    fi
    STANDIN_NVIDIA_SMI_REPLAY=$answer
    export STANDIN_NVIDIA_SMI_REPLAY
fi
exec /usr/bin/python3 -IS "$py" "$@"
