#!/usr/bin/env bash
# Prune NVIDIA's Triton image to the backends named in $TRITON_BACKENDS (comma-separated) and the
# libraries they need, print what each kept or removed part weighs, and fail when the tree is still
# over $MAX_TREE_MB (FC's image limit less room for the function's venv, Python and models).
# Run as root inside the image's build (images/aliyun-fc/Dockerfile).
set -euo pipefail

backends_dir=/opt/tritonserver/backends
keep=" ${TRITON_BACKENDS//,/ } "
max_mb=${MAX_TREE_MB:?MAX_TREE_MB is not set}

mb() { du -sxm "$@" 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }

available=$(find "$backends_dir" -mindepth 1 -maxdepth 1 -type d -printf '%f ' | sort)
for name in $keep; do
  if [ ! -d "$backends_dir/$name" ]; then
    echo "error: TRITON_BACKENDS names '$name', which this base does not have (it has: $available)" >&2
    exit 1
  fi
done

kept() { [[ "$keep" == *" $1 "* ]]; }

for dir in "$backends_dir"/*/; do
  name=$(basename "$dir")
  if kept "$name"; then
    echo "keeping backend $name: $(mb "$dir") MB"
  else
    echo "removing backend $name: $(mb "$dir") MB"
    rm -rf "$dir"
  fi
done

# library_group NAME NEEDED-BY PATTERN...: files named by find(1) patterns, kept when a backend
# that needs them is kept.
library_group() {
  local group=$1 needed_by=$2 user files=()
  shift 2
  local expr=() pattern
  for pattern in "$@"; do expr+=(${expr[0]+-o} -name "$pattern"); done
  mapfile -t files < <(find / -xdev \( -type f -o -type l \) \( "${expr[@]}" \) 2>/dev/null)
  for user in $needed_by; do
    if kept "$user"; then
      echo "keeping $group for $user: $(mb "${files[@]}" /dev/null) MB"
      return
    fi
  done
  echo "removing $group: $(mb "${files[@]}" /dev/null) MB"
  [ ${#files[@]} -eq 0 ] || rm -f "${files[@]}"
}

library_group TensorRT "tensorrt onnxruntime" 'libnvinfer*' 'libnvonnxparser*' 'libnvparsers*'
library_group cuDNN "pytorch onnxruntime tensorflow" 'libcudnn*'
kept tensorrt || kept onnxruntime || rm -rf /usr/src/tensorrt
# Static CUDA libraries only link programs; nothing loads them at run time.
find / -xdev -type f -path '/usr/local/cuda*/lib*/*_static*.a' -delete
rm -rf /usr/share/doc /usr/share/man /root/.cache

size_mb=$(du -sxm / | cut -f1)
echo "pruned tree: ${size_mb} MB (limit ${max_mb} MB)"
if [ "$size_mb" -gt "$max_mb" ]; then
  echo "error: the pruned tree is ${size_mb} MB, over MAX_TREE_MB=${max_mb}: FC takes images up to 15 GB" \
    "uncompressed on GPU instances (10 GB on CPU), and the venv, Python and models still come on top;" \
    "keep fewer backends in TRITON_BACKENDS (images/README.md, 'Model formats')" >&2
  exit 1
fi
