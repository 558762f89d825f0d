#!/usr/bin/env bash
# Stops what start.sh started: this cluster's Ray processes (and only them: never `ray stop`, which would stop
# every Ray on the machine) and its MLflow server. Outputs, the MLflow store and the token stay in the state dir.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${ALBERT_CLUSTER_STATE:-$here/.state}"
bin="$here/../../.venv/bin"; [[ -x "$bin/python" ]] || bin="$(dirname "$(command -v python3)")"
if [[ ! -e "$state/ray_tmp" ]]; then echo "no cluster running from $state"; exit 0; fi
ray_tmp="$(cat "$state/ray_tmp")"

# This cluster's Ray processes: they carry start.sh's ALBERT_LOCAL_CLUSTER marker in their environment or name its
# temp dir on their command line; their descendants (workers, job drivers) too. Never this script's own ancestors.
"$bin/python" - "$ray_tmp" "ALBERT_LOCAL_CLUSTER=$state" <<'PY'
import os, signal, sys, time

tmp, marker = sys.argv[1], sys.argv[2].encode()
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        ours = marker in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        continue
    procs[int(pid)] = (ppid, ours or tmp + "/" in cmd or f"--temp-dir={tmp}" in cmd)
targets = {pid for pid, (_, ours) in procs.items() if ours}
grew = True
while grew:
    more = {pid for pid, (ppid, _) in procs.items() if ppid in targets} - targets
    targets |= more
    grew = bool(more)
pid = os.getpid()
while pid > 1:
    targets.discard(pid)
    pid = procs.get(pid, (1, False))[0]
for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
    for pid in targets:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.time() + wait
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in targets):
        time.sleep(0.2)
print(f"stopped {len(targets)} Ray process(es) of {tmp}")
PY

if [[ -s "$state/mlflow.pid" ]]; then  # started with setsid: its pid is its process group
  kill -TERM -- "-$(cat "$state/mlflow.pid")" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$(cat "$state/mlflow.pid")" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$(cat "$state/mlflow.pid")" 2>/dev/null || true
  echo "stopped MLflow"
fi
rm -rf "$ray_tmp"
rm -f "$state/env.sh" "$state/env.sh.tmp" "$state/mlflow.pid" "$state/ray_tmp"
