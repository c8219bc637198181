#!/usr/bin/env bash
# Stand-in bases for the function images, made here from Debian's own packages (mmdebstrap) and
# committed with buildah, for machines that cannot pull the official ones (no registry, no daemon):
#
#   lambda: python:3.11.11-bookworm and python:3.11.11-slim-bookworm  ->  Debian bookworm's Python 3.11
#   fc:     nvcr.io/nvidia/tritonserver:24.10-py3  ->  Debian bookworm with /opt/tritonserver laid out as
#           NGC lays it out, from the nvidia-pytriton wheel's server (CPU only), and placeholders for
#           what the FC recipe prunes; ghcr.io/astral-sh/uv:0.5.11  ->  /uv from PyPI's uv wheel
#   gateway: apache/apisix:3.18.0-debian  ->  Debian bookworm with the APISIX 3.18 this machine already
#           runs (scripts/install-apisix.sh: Debian's nginx and Lua packages, APISIX's own Lua tree)
#           laid out as the official image lays it out; uv as for fc
#
# Prints the build arguments that select them (NAME=IMAGE, one a line). Each image's tag carries a
# hash of this script, so one already in the store is reused until the recipe changes (--refresh
# rebuilds). images/README.md says how close each is to the image it stands in for.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  echo "usage: images/standin/bases.sh [--refresh] lambda|fc|gateway" >&2
  exit 2
}
refresh=0
case "${1:-}" in --refresh) refresh=1 && shift ;; esac
[ $# -eq 1 ] || usage
which=$1

RECIPE=$(sha256sum "$0" | cut -c1-12)
PREFIX=localhost/spillway-standin
CACHE=${SPILLWAY_IMAGES_CACHE:-$PWD/.cache/images}
PYTRITON=nvidia-pytriton==0.7.0
UV=uv==0.5.11
START=$SECONDS

log() { printf '[standin %3ds] %s\n' $((SECONDS - START)) "$*" >&2; }

for tool in mmdebstrap buildah; do
  command -v "$tool" >/dev/null || {
    echo "error: $tool is not installed: apt-get install -y $tool (Debian 12, as root)" >&2
    exit 1
  }
done

have() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# Debian's security and point-release updates too, as the official images have them.
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# What Debian's slim images leave out (documentation, manuals, translations), copyrights kept.
SLIM=(
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
)

rootfs() {  # rootfs DIR PACKAGES: a minimal bookworm with PACKAGES, merged /usr, apt lists dropped
  log "mmdebstrap bookworm + $2 (about a minute: it downloads and unpacks each package)"
  rm -rf "$1"
  mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${SLIM[@]}" \
    --include="$2" --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' bookworm "$1" "${MIRRORS[@]}"
}

commit() {  # commit DIR IMAGE [buildah config options...]: the folder as a one-layer image
  local dir=$1 image=$2 c
  shift 2
  c=$(buildah from scratch)
  buildah add --quiet "$c" "$dir" / >/dev/null
  buildah config --env LANG=C.UTF-8 "$@" "$c"
  buildah commit --quiet --rm "$c" "$image" >/dev/null
  rm -rf "$dir"
  log "committed $image"
}

wheel() {  # wheel SPEC: the path of the downloaded wheel (kept in the cache)
  mkdir -p "$CACHE/wheels"
  local name=${1%%==*} version=${1##*==}
  local found=("$CACHE/wheels/${name//-/_}-$version-"*.whl)
  if [ ! -e "${found[0]}" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$CACHE/wheels" "$1" >&2
    found=("$CACHE/wheels/${name//-/_}-$version-"*.whl)
  fi
  echo "${found[0]}"
}

PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/spillway-standin.XXXXXX")
trap 'rm -rf "$work"' EXIT

python_bases() {
  local slim=$PREFIX/python:3.11-slim-bookworm-$RECIPE full=$PREFIX/python:3.11-bookworm-$RECIPE
  # python:3.11.11-slim-bookworm: Python with its shared library, certificates, netbase, tzdata.
  if [ $refresh = 1 ] || ! have "$slim"; then
    rootfs "$work/slim" python3,libpython3.11,python-is-python3,python3-venv,ca-certificates,netbase,tzdata
    commit "$work/slim" "$slim" --env "$PATH_ENV" --cmd python3
  fi
  # python:3.11.11-bookworm: the same with a C compiler (the image's /dev/shm shim is built with it).
  if [ $refresh = 1 ] || ! have "$full"; then
    rootfs "$work/full" python3,libpython3.11,python-is-python3,python3-venv,ca-certificates,netbase,tzdata,gcc,libc6-dev
    commit "$work/full" "$full" --env "$PATH_ENV" --cmd python3
  fi
  echo "PYTHON_BUILD_IMAGE=$full"
  echo "PYTHON_IMAGE=$slim"
}

placeholder() {  # placeholder FILE MB: stands for a library the FC recipe prunes (zeros, real blocks)
  mkdir -p "$(dirname "$1")"
  head -c "$(($2 * 1024 * 1024))" /dev/zero >"$1"
}

triton_layout() {  # triton_layout ROOT: /opt/tritonserver as NGC has it, from the pytriton wheel
  local root=$1 unpacked=$work/pytriton
  python3 -m zipfile -e "$(wheel "$PYTRITON")" "$unpacked"
  local bundle=$unpacked/pytriton/tritonserver opt=$root/opt/tritonserver
  mkdir -p "$opt/backends"
  cp -r "$bundle/bin" "$bundle/caches" "$opt/"
  cp -r "$bundle/backends/python" "$opt/backends/"
  cp "$bundle/python_backend_stubs/3.11/triton_python_backend_stub" "$opt/backends/python/"
  cp -r "$unpacked/nvidia_pytriton.libs" "$opt/lib"
  rm -f "$opt"/lib/libpython3-*.so*
  chmod 0755 "$opt/bin/tritonserver" "$opt/backends/python/triton_python_backend_stub"
  # The backends and libraries NGC's image carries and the recipe prunes (sizes made up, small).
  local backend
  for backend in onnxruntime:24 pytorch:32 tensorrt:4 openvino:8 fil:4 dali:4 identity:1; do
    placeholder "$opt/backends/${backend%%:*}/libtriton_${backend%%:*}.so" "${backend##*:}"
  done
  local lib=$root/usr/lib/x86_64-linux-gnu
  placeholder "$lib/libnvinfer.so.10.5.0" 16
  placeholder "$lib/libnvonnxparser.so.10.5.0" 2
  placeholder "$lib/libcudnn.so.9.5.0" 16
  placeholder "$root/usr/local/cuda-12.6/targets/x86_64-linux/lib/libcublas_static.a" 8
  ln -s cuda-12.6 "$root/usr/local/cuda"
  placeholder "$root/usr/src/tensorrt/samples/placeholder" 1
  chroot "$root" useradd --uid 1000 --create-home --shell /bin/bash triton-server
}

uv_base() {  # ghcr.io/astral-sh/uv:0.5.11: /uv from PyPI's uv wheel
  local uv=$PREFIX/uv:0.5.11-$RECIPE
  if [ $refresh = 1 ] || ! have "$uv"; then
    python3 -m zipfile -e "$(wheel "$UV")" "$work/uv-wheel"
    mkdir -p "$work/uv"
    install -m 0755 "$work/uv-wheel/uv-0.5.11.data/scripts/uv" "$work/uv/uv"
    commit "$work/uv" "$uv" --cmd /uv
  fi
  echo "UV_IMAGE=$uv"
}

fc_bases() {
  local triton=$PREFIX/tritonserver:24.10-py3-$RECIPE
  if [ $refresh = 1 ] || ! have "$triton"; then
    # NGC's image runs Triton's Python backend on its python3 with numpy (3.10 there, 3.11 here).
    rootfs "$work/triton" python3,libpython3.11,python3-numpy,python3-venv,ca-certificates
    log "laying out /opt/tritonserver from $PYTRITON"
    triton_layout "$work/triton"
    commit "$work/triton" "$triton" --env "PATH=/opt/tritonserver/bin:${PATH_ENV#PATH=}" \
      --env LD_LIBRARY_PATH=/opt/tritonserver/lib --env TRITON_SERVER_VERSION=2.51.0 --cmd /bin/bash
  fi
  echo "TRITON_IMAGE=$triton"
  uv_base
  # The stand-in has Python 3.11 (Debian's): the venv uses it instead of downloading one.
  echo "FUNCTION_PYTHON=3.11"
  echo "UV_PYTHON_PREFERENCE=only-system"
}

# What APISIX's testbed needs at run time from Debian (third_party/apisix-testbed/install.sh, less
# its compilers and headers), and Python for the runner's venv (the official image has none).
APISIX_RUNTIME=nginx,libnginx-mod-http-lua,libnginx-mod-http-ndk,libnginx-mod-http-headers-more-filter
APISIX_RUNTIME+=,lua-resty-core,lua-resty-lrucache,luajit2,lua-cjson,lua-socket,lua-filesystem,lua-yaml
APISIX_RUNTIME+=,lua-argparse,lua-penlight,lua-posix,lua-dkjson,lua-sec,lua-lpeg,lua-inspect,lua-bitop
APISIX_RUNTIME+=,lua-rex-pcre2,ca-certificates,python3,python3-venv

apisix_layout() {  # apisix_layout ROOT INSTALL: the installed APISIX where the official image has it
  local root=$1 install=$2 home=$1/usr/local/apisix
  mkdir -p "$home"
  # APISIX's code, Lua dependencies and default conf; not what a run made (logs, config, sockets).
  tar -C "$install/apisix" --exclude=./logs --exclude=./conf/config.yaml --exclude=./conf/apisix.yaml \
    --exclude=./conf/nginx.conf --exclude=./conf/apisix.uid --exclude='./conf/*.sock' -cf - . |
    tar -C "$home" -xf -
  mkdir -p "$home/logs"
  # The testbed's CLI finds APISIX's home from its own place (/usr/local/bin/.. -> /usr/local/apisix);
  # the official image has the CLI at /usr/bin/apisix and OpenResty in /usr/local/openresty/bin.
  install -m 0755 "$install/bin/apisix" "$install/bin/openresty" "$root/usr/local/bin/"
  printf '#!/bin/sh\nexec /usr/local/bin/apisix "$@"\n' >"$root/usr/bin/apisix"
  chmod 0755 "$root/usr/bin/apisix"
  mkdir -p "$root/usr/local/openresty/bin"
  ln -s /usr/local/bin/openresty "$root/usr/local/openresty/bin/openresty"
  # OpenResty keeps its temporary files under the prefix; Debian's nginx in /var/lib/nginx.
  local debian openresty
  rm -rf "$root/var/lib/nginx"
  mkdir -p "$root/var/lib/nginx"
  for debian in body:client_body proxy:proxy fastcgi:fastcgi uwsgi:uwsgi scgi:scgi; do
    openresty=${debian#*:}_temp
    ln -s "/usr/local/apisix/$openresty" "$root/var/lib/nginx/${debian%%:*}"
  done
  # The official image's user, and /usr/local/apisix owned by it.
  chroot "$root" groupadd --system --gid 636 apisix
  chroot "$root" useradd --system --gid apisix --no-create-home --shell /usr/sbin/nologin --uid 636 apisix
  chroot "$root" chown -R apisix:apisix /usr/local/apisix
  ln -sf /dev/stdout "$home/logs/access.log"
  ln -sf /dev/stderr "$home/logs/error.log"
}

gateway_bases() {
  local install=${SPILLWAY_APISIX_PREFIX:-/opt/spillway-apisix} stamp
  stamp=$(find "$install" -maxdepth 1 -name '.spillway-installed-*' -printf '%f\n' 2>/dev/null | head -n 1)
  if [ -z "$stamp" ] || [ ! -x "$install/bin/apisix" ]; then
    echo "error: no APISIX in $install: run 'bash scripts/install-apisix.sh' (needs root and apt on Debian 12)" >&2
    exit 1
  fi
  local apisix=$PREFIX/apisix:3.18.0-debian-$RECIPE-${stamp#.spillway-installed-}
  if [ $refresh = 1 ] || ! have "$apisix"; then
    rootfs "$work/apisix" "$APISIX_RUNTIME"
    log "laying out /usr/local/apisix from $install"
    apisix_layout "$work/apisix" "$install"
    commit "$work/apisix" "$apisix" --env "${PATH_ENV}:/usr/local/openresty/bin" \
      --workingdir /usr/local/apisix --user apisix --port 9080/tcp --port 9443/tcp --stop-signal SIGQUIT
  fi
  echo "BASE=$apisix"
  uv_base
  echo "RUNNER_PYTHON=3.11"
  echo "UV_PYTHON_PREFERENCE=only-system"
}

case "$which" in
  lambda) python_bases ;;
  fc) fc_bases ;;
  gateway) gateway_bases ;;
  *) usage ;;
esac
