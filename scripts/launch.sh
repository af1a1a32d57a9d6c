#!/usr/bin/env bash
# Run a sweep on a Ray cluster in the cloud:
#
#   scripts/launch.sh SPEC [sweep submit options: --out DIR, --backend B, --max-trials N]
#
# 1. brings the cluster of configs/cluster.yaml up (`ray up`; a cluster already up is
#    updated, which takes seconds), from this checkout's root, which it copies to every node;
# 2. fetches the cluster's authentication token from the head, and waits until the
#    cluster has WAIT_GPUS GPUs (`ray up` returns before the GPU nodes are set up; a sweep
#    submitted then would find no GPU and run on the head's CPUs, or fewer workers);
# 3. forwards the head's dashboard to this machine (`ray dashboard`, in the background,
#    ended when this script ends);
# 4. runs `sweep submit SPEC --address http://127.0.0.1:PORT ...` from the current directory
#    (so your spec and kernel modules travel with the job), following the sweep to its end;
# 5. says how to fetch the run directory back (`ray rsync-down`).
#
# Ctrl+C: as `sweep submit` (the first stops the sweep cleanly, a second stops waiting).
# The cluster stays up for `sweep resume` or the next sweep: `ray down -y CONFIG` ends it.
# Environment: CLUSTER_CONFIG (default: configs/cluster.yaml of this checkout),
# DASHBOARD_PORT (the local end of the tunnel, default 8265), WAIT_GPUS (default 1: set
# it to the GPUs of the nodes you want the sweep to start with; at most 30 min).
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
config=$(realpath "${CLUSTER_CONFIG:-$root/configs/cluster.yaml}")
port=${DASHBOARD_PORT:-8265}
ssh_user=ubuntu  # configs/cluster.yaml's auth.ssh_user: the token's path on the head

for tool in ray sweep python3; do
    command -v "$tool" >/dev/null || {
        echo "launch.sh: $tool not found; install this project with: pip install -e '.[cluster]'" >&2
        exit 2
    }
done
if python3 - "$port" <<'EOF'
import socket, sys
with socket.socket() as s:
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
then
    echo "launch.sh: port $port is in use here (a local Ray dashboard?); set DASHBOARD_PORT" >&2
    exit 2
fi

echo "== ray up $config"
(cd "$root" && ray up -y "$config")

cluster=$(sed -n 's/^cluster_name: *\([^ #]*\).*/\1/p' "$config")
token="$HOME/.ray/$cluster.auth_token"
mkdir -p "$HOME/.ray"
(umask 077 && ray rsync-down "$config" "/home/$ssh_user/.ray/auth_token" "$token")
chmod 600 "$token"

wait_gpus=${WAIT_GPUS:-1}
echo "== waiting for $wait_gpus GPU(s) in the cluster"
deadline=$((SECONDS + 1800))
while :; do
    gpus=$(ray exec "$config" "python -c 'import ray; ray.init(address=\"auto\", \
logging_level=\"ERROR\"); print(int(ray.cluster_resources().get(\"GPU\", 0)))'" \
        2>/dev/null | tail -n 1) || gpus=0
    [[ $gpus =~ ^[0-9]+$ ]] || gpus=0
    if ((gpus >= wait_gpus)); then
        echo "   $gpus GPU(s)"
        break
    fi
    if ((SECONDS > deadline)); then
        echo "launch.sh: the cluster has $gpus of $wait_gpus GPUs after 30 min; see ray status" >&2
        exit 1
    fi
    sleep 15
done

echo "== ray dashboard: http://127.0.0.1:$port"
tunnel_log=$(mktemp "${TMPDIR:-/tmp}/ray-dashboard.XXXXXX")
ray dashboard -p "$port" "$config" >"$tunnel_log" 2>&1 &
tunnel=$!
# `ray dashboard` holds the tunnel open in an ssh process of its own: end both.
trap 'pkill -TERM -P "$tunnel" 2>/dev/null || true; kill "$tunnel" 2>/dev/null || true
      rm -f "$tunnel_log"' EXIT
python3 - "$port" "$tunnel_log" <<'EOF'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/api/version"
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        break
    except OSError as e:
        if getattr(e, "code", None) in (401, 403):  # the dashboard, asking for the token
            break
        if time.monotonic() > deadline:
            sys.exit(f"launch.sh: the dashboard did not answer at {url} within 60 s "
                     f"(see {sys.argv[2]})")
        time.sleep(0.5)
EOF

echo "== sweep submit $*"
log=$(mktemp "${TMPDIR:-/tmp}/sweep-submit.XXXXXX")
set +e
# tee ignores Ctrl+C, so that it still shows what `sweep submit` prints while it stops.
RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$token" \
    sweep submit "$@" --address "http://127.0.0.1:$port" 2>&1 | (trap '' INT; exec tee "$log")
code=${PIPESTATUS[0]}
set -e

run_dir=$(sed -n 's/^  run directory (on the head node): //p' "$log" | tail -n 1)
rm -f "$log"
if [[ -n $run_dir ]]; then
    echo
    echo "Fetch the run directory (on the head node's disk) back here:"
    echo "  ray rsync-down $config $run_dir/ runs/$(basename "$run_dir")/"
    echo "Stop the cluster when done: ray down -y $config"
fi
exit "$code"
