#!/bin/sh
# Entrypoint of the Alibaba FC image: use CUDA's forward-compatibility libraries when the host
# driver is older than the image's CUDA (what NVIDIA's own entrypoint decides, without needing
# root), then run the command, by default the FC custom-container server on port 9000.
set -eu

compat_dir=${SPILLWAY_CUDA_COMPAT_DIR:-/usr/local/cuda/compat/lib.real}
driver_file=${SPILLWAY_DRIVER_VERSION_FILE:-/proc/driver/nvidia/version}

major_of() {  # first dotted version number in the input, major part only
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+(\.[0-9]+)?$/) { split($i, v, "."); print v[1]; exit } }'
}

if [ -d "$compat_dir" ] && [ -r "$driver_file" ]; then
    host_major=$(head -n 1 "$driver_file" | major_of)
    compat_lib=$(find "$compat_dir" -maxdepth 1 -name 'libcuda.so.*.*' | head -n 1)
    compat_major=$(basename "${compat_lib:-none}" | sed -n 's/^libcuda\.so\.\([0-9][0-9]*\)\..*/\1/p')
    if [ -n "$host_major" ] && [ -n "$compat_major" ] && [ "$host_major" -lt "$compat_major" ]; then
        echo "spillway: host driver $host_major < CUDA compat $compat_major, using $compat_dir" >&2
        LD_LIBRARY_PATH="$compat_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LD_LIBRARY_PATH
    fi
fi

exec "$@"
