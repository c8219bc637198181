#!/bin/sh
# Entrypoint of the gateway image: APISIX in the foreground, which starts Spillway's runner itself
# (ext-plugin.cmd in the mounted config.yaml). Everything it writes goes to conf (nginx.conf, the
# runner's socket), logs and /tmp, so the root can be read-only with those three mounted empty;
# APISIX's own conf files are put back in an empty conf, without touching the mounted ones.
set -eu

home=${APISIX_HOME:-/usr/local/apisix}
config=${SPILLWAY_CONFIG:-/etc/spillway/spillway.yaml}

die() {
    echo "spillway-gateway: $*" >&2
    exit 1
}

if [ "${1:-}" != docker-start ]; then
    exec "$@"
fi

for dir in "$home/conf" "$home/logs" /tmp; do
    [ -w "$dir" ] || die "$dir is not writable: mount an empty folder there (emptyDir) with a read-only root"
done
[ -f "$home/conf/config.yaml" ] && [ -f "$home/conf/apisix.yaml" ] \
    || die "mount APISIX's config.yaml and apisix.yaml in $home/conf (examples/apisix)"
[ -r "$config" ] || die "mount spillway.yaml at $config (or set SPILLWAY_CONFIG)"

# The image's conf/ under what was mounted there: a mounted file or folder (cert/) wins whole, and
# nothing is written into a mount (a Secret's is read-only). Not `cp -n`: coreutils 9.2-9.4 exit 1
# when it skips a file.
for file in /opt/spillway/apisix-conf/* /opt/spillway/apisix-conf/.[!.]*; do
    [ -e "$file" ] || continue
    [ -e "$home/conf/${file##*/}" ] || cp -R "$file" "$home/conf/"
done
# Logs to the container's own output, unless a file is wanted (an existing one is kept).
[ -e "$home/logs/error.log" ] || ln -s /dev/stderr "$home/logs/error.log"
[ -e "$home/logs/access.log" ] || ln -s /dev/stdout "$home/logs/access.log"
for temp in client_body proxy fastcgi uwsgi scgi; do
    mkdir -p "/tmp/nginx/${temp}_temp"
done

# A policy the runner would refuse fails here, once, not in APISIX's respawn loop.
/opt/spillway/.venv/bin/python -m gateway_plugin check-config "$config" >/dev/null

cd "$home"
apisix init
exec openresty -p "$home" -c conf/nginx.conf -e logs/error.log -g 'daemon off;'
