#!/usr/bin/env bash
# Build a function image, or the gateway's, with Docker where its daemon answers, else with buildah
# (no daemon, no registry), print its size and fail when it is over the limit. --help says more.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
Usage: scripts/build-images.sh [OPTIONS] lambda|fc|gateway

Builds images/aws-lambda/Dockerfile (lambda), images/aliyun-fc/Dockerfile (fc) or
images/gateway/Dockerfile (gateway: APISIX with Spillway's runner and Lua plugins) from the
repository root for linux/amd64, prints the image's uncompressed size, and fails (exit 1) when it
is over the limit on uncompressed images:
  lambda   10 GB  (AWS Lambda quotas: container image code package size, all layers)
  fc       15 GB  (Function Compute 3.0 custom containers on GPU instances; 10 GB on CPU instances)
  gateway   2 GB  (no platform's: a bound that catches a build gone wrong)

Options:
  -t, --tag NAME          image name (default: spillway-aws-lambda, spillway-aliyun-fc or
                          spillway-gateway)
  --build-arg NAME=VALUE  passed to the build (repeatable). The Dockerfiles take:
                            lambda: PYTHON_BUILD_IMAGE, PYTHON_IMAGE, MODEL_REPOSITORY
                            fc:     TRITON_IMAGE, UV_IMAGE, TRITON_BACKENDS (backends to keep,
                                    e.g. python,onnxruntime), MAX_TREE_MB, FUNCTION_PYTHON,
                                    UV_PYTHON_PREFERENCE, MODEL_REPOSITORY
                            gateway: BASE (APISIX's Debian image), UV_IMAGE, RUNNER_PYTHON,
                                    UV_PYTHON_PREFERENCE
  --target STAGE          build only up to this stage of the Dockerfile
  --engine ENGINE         docker, buildah, or auto (default: docker if its daemon answers, else buildah)
  --standin               build on stand-in bases made here from Debian's packages instead of the
                          official ones (buildah only; images/standin/bases.sh makes them once, in
                          about 1-3 minutes; images/README.md says what that proves and what not)
  --limit-gb N            the limit to check, in GB of 10^9 bytes (default: the platform's, above)
  -h, --help              this help

With buildah, the host's CA certificates (/etc/ssl/certs) are mounted read-only into the build's
RUN steps, so that pip reaches the package index behind a TLS-intercepting proxy; they do not end
up in the image. buildah keeps its own settings: STORAGE_DRIVER, CONTAINERS_STORAGE_CONF,
BUILDAH_ISOLATION (default here: chroot, which needs no daemon or user namespace).
EOF
}

die() {
  echo "error: $*" >&2
  exit 1
}

tag="" engine=auto standin=0 limit_gb="" target="" which=""
build_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage && exit 0 ;;
    -t | --tag) tag=${2:?--tag needs a name} && shift ;;
    --build-arg) build_args+=("${2:?--build-arg needs NAME=VALUE}") && shift ;;
    --target) target=${2:?--target needs a stage} && shift ;;
    --engine) engine=${2:?--engine needs docker, buildah or auto} && shift ;;
    --standin) standin=1 ;;
    --limit-gb) limit_gb=${2:?--limit-gb needs a number} && shift ;;
    lambda | fc | gateway) [ -z "$which" ] || die "name one image, lambda, fc or gateway" && which=$1 ;;
    *) usage >&2 && die "unknown argument '$1' (see above)" ;;
  esac
  shift
done
[ -n "$which" ] || { usage >&2 && die "name the image to build: lambda, fc or gateway"; }

case "$which" in
  lambda) dockerfile=images/aws-lambda/Dockerfile && platform_limit=10 && tag=${tag:-spillway-aws-lambda} ;;
  fc) dockerfile=images/aliyun-fc/Dockerfile && platform_limit=15 && tag=${tag:-spillway-aliyun-fc} ;;
  gateway) dockerfile=images/gateway/Dockerfile && platform_limit=2 && tag=${tag:-spillway-gateway} ;;
esac
limit_gb=${limit_gb:-$platform_limit}
[[ "$limit_gb" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--limit-gb takes a number of GB, not '$limit_gb'"

START=$SECONDS
log() { printf '[build-images %3ds] %s\n' $((SECONDS - START)) "$*" >&2; }

if [ "$engine" = auto ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v buildah >/dev/null 2>&1; then
    engine=buildah
  else
    die "no Docker daemon answers and buildah is not installed: start Docker, or install buildah (apt-get install -y buildah on Debian 12)"
  fi
fi
case "$engine" in
  docker | buildah) command -v "$engine" >/dev/null 2>&1 || die "$engine is not installed" ;;
  *) die "--engine takes docker, buildah or auto, not '$engine'" ;;
esac

if [ $standin = 1 ]; then
  [ "$engine" = buildah ] || die "--standin builds with buildah (the stand-in bases live in its store)"
  log "stand-in bases for $which (images/standin/bases.sh)"
  mapfile -t standin_args < <(bash images/standin/bases.sh "$which")
  [ ${#standin_args[@]} -gt 0 ] || die "images/standin/bases.sh made no bases"
  build_args=("${standin_args[@]}" "${build_args[@]}")
fi

args=(-f "$dockerfile" -t "$tag")
for a in "${build_args[@]}"; do args+=(--build-arg "$a"); done
[ -z "$target" ] || args+=(--target "$target")

log "building $dockerfile as $tag with $engine (buildah prints each STEP as it goes)"
if [ "$engine" = docker ]; then
  DOCKER_BUILDKIT=1 docker build --platform linux/amd64 "${args[@]}" .
  size=$(docker image inspect -f '{{.Size}}' "$tag")
else
  mounts=()
  [ -d /etc/ssl/certs ] && mounts=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
  pull=()
  [ $standin = 1 ] && pull=(--pull-never)
  buildah bud --layers --force-rm --format docker --platform linux/amd64 \
    --isolation "${BUILDAH_ISOLATION:-chroot}" "${pull[@]}" "${mounts[@]}" "${args[@]}" .
  # The local manifest lists each layer as the uncompressed tar it is stored as.
  size=$(buildah inspect --type image --format '{{.Manifest}}' "$tag" |
    python3 -c 'import json, sys; print(sum(layer["size"] for layer in json.load(sys.stdin)["layers"]))')
fi

python3 - "$tag" "$size" "$limit_gb" "$platform_limit" "$which" "$((SECONDS - START))" <<'EOF'
import sys

tag, size, limit, platform_limit, which, seconds = sys.argv[1:]
size_gb, limit_gb = int(size) / 1e9, float(limit)
print(f"{tag}: {int(size):,} bytes ({size_gb:.2f} GB) uncompressed, built in {seconds} s; "
      f"limit {limit_gb:g} GB (the platform's: {platform_limit} GB)")
if size_gb > limit_gb:
    hint = {
        "fc": "keep fewer Triton backends (TRITON_BACKENDS) or bake smaller models",
        "gateway": "see what the venv or the base brought (buildah inspect, podman image tree)",
    }.get(which, "bake smaller models, or load weights at start")
    sys.exit(f"error: {tag} is {size_gb:.2f} GB, over the {limit_gb:g} GB limit: {hint} "
             "(images/README.md, 'Model formats')")
EOF
