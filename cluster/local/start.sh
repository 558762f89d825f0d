#!/usr/bin/env bash
# A real Ray cluster on this machine (a head node + N worker nodes, each its own `ray start`) and an MLflow
# tracking server: Ray token authentication on, MLflow basic auth on, the dashboard and MLflow on 127.0.0.1 only
# (and every other listener too with the default --workers 0; see below).
# Writes $STATE/env.sh (source it, then `albert-dist submit ...`); stop everything with stop.sh.
#
#   cluster/local/start.sh [--workers N] [--cpus-per-node C] [--no-mlflow-auth]
#
# Environment: ALBERT_CLUSTER_STATE (default cluster/local/.state), ALBERT_RAY_PORT (6390),
# ALBERT_DASHBOARD_PORT (8265), ALBERT_MLFLOW_PORT (5000), ALBERT_MLFLOW_ADMIN_PASSWORD (default: generated),
# ALBERT_DIST_HOME (job outputs; default $STATE/outputs), ALBERT_OBJECT_STORE_BYTES (500 MB per node).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
workers=0 cpus=2 mlflow_auth=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --cpus-per-node) cpus="$2"; shift 2 ;;
    --no-mlflow-auth) mlflow_auth=0; shift ;;
    *) echo "usage: $0 [--workers N] [--cpus-per-node C] [--no-mlflow-auth]" >&2; exit 2 ;;
  esac
done

state="${ALBERT_CLUSTER_STATE:-$here/.state}"
ray_port="${ALBERT_RAY_PORT:-6390}" dashboard_port="${ALBERT_DASHBOARD_PORT:-8265}"
mlflow_port="${ALBERT_MLFLOW_PORT:-5000}" store_bytes="${ALBERT_OBJECT_STORE_BYTES:-500000000}"
bin="$root/.venv/bin"; [[ -x "$bin/ray" ]] || bin="$(dirname "$(command -v ray)")"
if [[ -e "$state/ray_tmp" ]]; then
  echo "a cluster already runs from $state (stop it with cluster/local/stop.sh)" >&2; exit 1
fi
umask 077  # state files (token, passwords, databases) readable by this user only
mkdir -p "$state/logs" "$state/mlflow/artifacts"
outputs="${ALBERT_DIST_HOME:-$state/outputs}"; mkdir -p "$outputs"
# Ray's temp dir holds Unix sockets (path limit ~107 bytes): a short path of its own, apart from other Rays.
ray_tmp="/tmp/albert-ray-$ray_port"
echo "$ray_tmp" > "$state/ray_tmp"
trap 'code=$?; [[ $code == 0 ]] || ALBERT_CLUSTER_STATE="$state" bash "$here/stop.sh" >&2' EXIT

free_port() { "$bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
secret() { "$bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))'; }

# Ray token auth: every Ray process of this cluster reads the token from a file only this user can read.
[[ -s "$state/ray_auth_token" ]] || secret > "$state/ray_auth_token"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$state/ray_auth_token" RAY_USAGE_STATS_ENABLED=0
export RAY_TRAIN_ENABLE_PRINT_PATCH=0  # Ray 2.60 Train workers would print every line twice (albert_dist/cluster/ray_init.py)
export ALBERT_LOCAL_CLUSTER="$state"  # marks this cluster's processes for stop.sh
export PATH="$bin:$PATH"  # a job's `python` is this environment's
unset RAY_AUTH_TOKEN RAY_ADDRESS

# --- MLflow tracking server, artifacts proxied (nodes need no shared disk for them) ---
mlflow_args=(server --backend-store-uri "sqlite:///$state/mlflow/mlflow.db"
             --artifacts-destination "$state/mlflow/artifacts" --host 127.0.0.1 --port "$mlflow_port" --workers 1)
if [[ $mlflow_auth == 1 ]]; then
  if ! "$bin/python" -c 'import flask_wtf' 2>/dev/null; then
    echo "MLflow basic auth needs Flask-WTF: pip install 'mlflow[auth]' (or start with --no-mlflow-auth)" >&2
    exit 1
  fi
  [[ -s "$state/mlflow_admin_password" ]] || printf '%s\n' "${ALBERT_MLFLOW_ADMIN_PASSWORD:-$(secret)}" \
    > "$state/mlflow_admin_password"
  [[ -s "$state/mlflow_secret_key" ]] || secret > "$state/mlflow_secret_key"
  cat > "$state/mlflow_auth.ini" <<EOF
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///$state/mlflow/basic_auth.db
admin_username = admin
admin_password = $(cat "$state/mlflow_admin_password")
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
EOF
  mlflow_args+=(--app-name basic-auth)
fi
(
  [[ $mlflow_auth == 1 ]] && export MLFLOW_AUTH_CONFIG_PATH="$state/mlflow_auth.ini" \
    MLFLOW_FLASK_SERVER_SECRET_KEY="$(cat "$state/mlflow_secret_key")"
  unset RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH
  export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false  # no server-side job runner processes: nothing here uses them
  exec setsid "$bin/mlflow" "${mlflow_args[@]}" > "$state/logs/mlflow.log" 2>&1 < /dev/null
) &
echo $! > "$state/mlflow.pid"
for _ in $(seq 1 120); do  # MLflow answers /health once its worker is up
  if "$bin/python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$mlflow_port/health', timeout=2)" \
      2>/dev/null; then mlflow_up=1; break; fi
  if ! kill -0 "$(cat "$state/mlflow.pid")" 2>/dev/null; then break; fi
  sleep 1
done
if [[ -z "${mlflow_up:-}" ]]; then
  echo "MLflow did not come up; its log:" >&2; tail -n 30 "$state/logs/mlflow.log" >&2; exit 1
fi
# Jobs log as a user of their own, `albert-jobs`, not as admin: with default_permission NO_PERMISSIONS it may
# create experiments and gets MANAGE on those it creates, and nothing on the others (the admin's, anyone else's).
if [[ $mlflow_auth == 1 ]]; then
  [[ -s "$state/mlflow_jobs_password" ]] || secret > "$state/mlflow_jobs_password"
  MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD="$(cat "$state/mlflow_admin_password")" \
    "$bin/python" - "http://127.0.0.1:$mlflow_port" "$state/mlflow_jobs_password" <<'PY'
import sys
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client

users = get_app_client("basic-auth", tracking_uri=sys.argv[1])
password = Path(sys.argv[2]).read_text().strip()
try:
    users.create_user("albert-jobs", password)
except MlflowException as err:  # a restart on the same state: the user is there already
    if err.error_code != "RESOURCE_ALREADY_EXISTS":
        raise
    users.update_user_password("albert-jobs", password)
PY
fi

# --- Ray: a head node, then the worker nodes, each its own `ray start` ---
# Ray binds its own servers (GCS, raylets, object managers, agents, metrics) to loopback only when the node IP is
# 127.0.0.1, which it allows only in its single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, no worker
# nodes): `ray start --node-ip-address 127.0.0.1` is rewritten to the machine's address. So with --workers 0 (the
# default) everything listens on 127.0.0.1; with worker nodes those servers listen on all interfaces, protected by
# the token (docs/cluster.md lists them) - keep such a machine behind a firewall.
# Jobs and their Train workers find the tracking server and its credentials in the nodes' environment: Ray logs
# a job's runtime env, so `albert-dist submit` never sends passwords with it.
export MLFLOW_TRACKING_URI="http://127.0.0.1:$mlflow_port"
if [[ $mlflow_auth == 1 ]]; then
  export MLFLOW_TRACKING_USERNAME=albert-jobs MLFLOW_TRACKING_PASSWORD="$(cat "$state/mlflow_jobs_password")"
fi
node_args=(--num-cpus "$cpus" --object-store-memory "$store_bytes" --temp-dir "$ray_tmp" --disable-usage-stats)
head_ip=127.0.0.1
if [[ $workers == 0 ]]; then export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0; else head_ip=""; fi
"$bin/ray" start --head --port "$ray_port" --dashboard-host 127.0.0.1 --dashboard-port "$dashboard_port" \
  --ray-client-server-port "$(free_port)" --dashboard-agent-listen-port "$(free_port)" "${node_args[@]}" \
  > "$state/logs/ray-head.log" 2>&1 || { cat "$state/logs/ray-head.log" >&2; exit 1; }
head_ip="${head_ip:-$(sed -n 's/.*Local node IP[^0-9]*\([0-9.]*\).*/\1/p' "$state/logs/ray-head.log" | head -n 1)}"
for i in $(seq 1 "$workers"); do
  "$bin/ray" start --address "$head_ip:$ray_port" --dashboard-agent-listen-port "$(free_port)" "${node_args[@]}" \
    > "$state/logs/ray-worker-$i.log" 2>&1 || { cat "$state/logs/ray-worker-$i.log" >&2; exit 1; }
done

# --- the environment for clients: no secret literal in it, only paths to the 600 files ---
{
  echo "# source me: albert-dist submit/jobs, ray, mlflow clients for the local cluster in $state"
  echo "export RAY_ADDRESS=http://127.0.0.1:$dashboard_port"
  echo "export RAY_GCS_ADDRESS=$head_ip:$ray_port"
  echo "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$state/ray_auth_token"
  echo "export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port"
  if [[ $mlflow_auth == 1 ]]; then
    echo "export MLFLOW_TRACKING_USERNAME=admin"
    echo "export MLFLOW_TRACKING_PASSWORD=\"\$(cat $state/mlflow_admin_password)\""
  fi
  echo "export ALBERT_DIST_HOME=$outputs"
} > "$state/env.sh.tmp"
mv "$state/env.sh.tmp" "$state/env.sh"
echo "Ray: head + $workers worker node(s), dashboard http://127.0.0.1:$dashboard_port (token auth)"
echo "MLflow: http://127.0.0.1:$mlflow_port$([[ $mlflow_auth == 1 ]] && echo ' (basic auth: you as admin, jobs as' \
  'albert-jobs)')"
echo "outputs: $outputs"
echo "next: source $state/env.sh"

