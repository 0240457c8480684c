# Sourced by .ci/test and .ci/demo: root, the apt packages the fleet needs, .venv with specfleet.
if [ "$(id -u)" != 0 ]; then
    echo "$0: the local fleet needs root (network namespaces, systemd-nspawn); re-running with sudo" >&2
    exec sudo -E "$0" "$@"
fi

# command -> Debian package
need=()
for pair in debootstrap:debootstrap systemd-nspawn:systemd-container ip:iproute2 ssh:openssh-client \
            scp:openssh-client patch:patch curl:curl git:git python3:python3 \
            promtool:prometheus prometheus-node-exporter:prometheus-node-exporter; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ "${#need[@]}" -gt 0 ]; then
    echo "$0: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends ca-certificates "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# (Re)install when pyproject.toml changed since the last install.
stamp=.venv/.specfleet-installed
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi
