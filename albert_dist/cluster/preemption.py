"""`albert-dist cluster watch-preemption`: turn a cloud's notice that this VM is about to go into a drain of its own
Ray node, with reason PREEMPTION and the notice's deadline.

Ray Train learns of a coming preemption only from a drain (`ray.train.get_preemption_info()` reads the GCS's
draining nodes), and nothing in a self-managed Ray cluster watches the cloud: without this a reclaimed spot VM simply
dies, the run restarts from its last periodic checkpoint and the death counts against `train.max_failures`.

What is watched (polled every `--interval` seconds; both clouds answer in milliseconds on their link-local server):

- AWS, IMDSv2 (a session token first, then the reads): `spot/instance-action` (the two-minute interruption notice,
  with the time the instance goes) and `events/recommendations/rebalance` (an elevated risk, no deadline).
- GCE: `instance/preempted` (TRUE once the 30 s preemption notice has started; no time given) and
  `instance/maintenance-event` (TERMINATE_ON_HOST_MAINTENANCE; MIGRATE_ON_HOST_MAINTENANCE keeps the VM and is left
  alone).

The drain goes through the GCS client's `drain_node`, the call Ray's own `ray drain-node` and the SIGTERM handler of
`ray start --block` make (`ray._raylet.GcsClient`, Ray 2.60; no public Python API drains a node).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from albert_dist.errors import AlbertDistError, ConfigError

AWS_METADATA_URL = "http://169.254.169.254"
GCE_METADATA_URL = "http://metadata.google.internal"
# How long GCE leaves a VM after `preempted` turns TRUE, and after a TERMINATE maintenance event is announced (it
# gives no time with either): its documented notices.
GCE_PREEMPTION_WINDOW_S = 30.0
GCE_MAINTENANCE_WINDOW_S = 60.0
AWS_TOKEN_TTL_S = 21600
HTTP_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Notice:
    """A cloud's warning: what it said, and when the VM goes (epoch seconds; None when the cloud gives no time)."""

    what: str
    deadline: float | None

    def outranks(self, other: Notice | None) -> bool:
        """Whether this notice calls for a new drain after `other` was sent: an earlier deadline, or a first one."""
        if other is None:
            return True
        if self.deadline is None:
            return False
        return other.deadline is None or self.deadline < other.deadline


def _iso_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _http(request: urllib.request.Request) -> tuple[int, str]:
    """The status and body of a metadata request; 404 and the like come back as a status, not an exception."""
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


class AwsMetadata:
    """EC2's instance metadata service, version 2: every read carries a session token from a PUT."""

    def __init__(self, base_url: str = AWS_METADATA_URL, rebalance: bool = True) -> None:
        self.base, self.rebalance, self._token = base_url.rstrip("/"), rebalance, ""

    def available(self) -> bool:
        try:
            self._new_token()
        except OSError:
            return False
        return True

    def _new_token(self) -> None:
        request = urllib.request.Request(
            f"{self.base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
        )
        status, body = _http(request)
        if status != 200:
            raise OSError(f"{self.base}: IMDSv2 token refused ({status})")
        self._token = body

    def _get(self, path: str) -> tuple[int, str]:
        for _ in range(2):  # an expired token answers 401: one more with a fresh one
            if not self._token:
                self._new_token()
            status, body = _http(
                urllib.request.Request(
                    f"{self.base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token}
                )
            )
            if status != 401:
                return status, body
            self._token = ""
        return status, body

    def notice(self) -> Notice | None:
        status, body = self._get("spot/instance-action")
        if status == 200:
            action = json.loads(body)
            return Notice(f"AWS spot interruption: {action['action']} at {action['time']}", _iso_time(action["time"]))
        if self.rebalance:
            status, body = self._get("events/recommendations/rebalance")
            if status == 200:
                return Notice(f"AWS rebalance recommendation of {json.loads(body)['noticeTime']}", None)
        return None


class GceMetadata:
    """Compute Engine's metadata server. Its notices carry no time: the deadline is the first sight of the notice
    plus the window GCE documents for it."""

    def __init__(self, base_url: str = GCE_METADATA_URL) -> None:
        self.base, self._first_seen = base_url.rstrip("/"), {}

    def _get(self, path: str) -> tuple[int, str]:
        request = urllib.request.Request(
            f"{self.base}/computeMetadata/v1/instance/{path}", headers={"Metadata-Flavor": "Google"}
        )
        return _http(request)

    def available(self) -> bool:
        try:
            return self._get("id")[0] == 200
        except OSError:
            return False

    def _seen(self, what: str, window_s: float) -> Notice:
        first = self._first_seen.setdefault(what, time.time())
        return Notice(what, first + window_s)

    def notice(self) -> Notice | None:
        status, body = self._get("preempted")
        if status == 200 and body.strip() == "TRUE":
            return self._seen("GCE preemption", GCE_PREEMPTION_WINDOW_S)
        status, body = self._get("maintenance-event")
        if status == 200 and body.strip().startswith("TERMINATE"):
            return self._seen(f"GCE host maintenance ({body.strip()})", GCE_MAINTENANCE_WINDOW_S)
        return None


def metadata_source(
    cloud: str, aws_url: str, gce_url: str, rebalance: bool, wait_s: float = 0.0, interval_s: float = 2.0
) -> AwsMetadata | GceMetadata:
    """The metadata service of `cloud`, or with `auto` the first that answers here within `wait_s` seconds (a
    negative `wait_s`: however long it takes; a node's metadata server may come up after the watcher)."""
    aws, gce = AwsMetadata(aws_url, rebalance), GceMetadata(gce_url)
    if cloud == "aws":
        return aws
    if cloud == "gce":
        return gce
    give_up = time.monotonic() + wait_s
    while True:
        for source in (aws, gce):
            if source.available():
                return source
        if 0 <= wait_s and give_up <= time.monotonic():
            break
        time.sleep(interval_s)
    raise ConfigError(
        f"no instance metadata at {aws_url} (AWS) nor {gce_url} (GCE): this is not a cloud VM, or its metadata "
        "service is out of reach (on Kubernetes: AWS's IMDSv2 needs a hop limit of 2 for pods); name --cloud and "
        "the URL to watch anyway"
    )


def gcs_address(address: str | None) -> str:
    """The GCS address to drain through: `address`, else the Ray this machine last started (`ray start` writes it
    on every node), else $RAY_ADDRESS."""
    from ray._private import services

    try:
        found = services.canonicalize_bootstrap_address(address or "auto")
    except (ConnectionError, ValueError) as err:
        raise ConfigError(f"no Ray to drain: {err}") from err
    if not found:
        raise ConfigError("no Ray to drain: no running Ray node on this machine and no --address")
    return found


def own_node_id(client, ip: str | None = None) -> str:
    """The hex id of the alive Ray node at this machine's address (`ip`, default the address Ray picks). Several
    nodes at one address (a test's local cluster) need --node-id."""
    import ray
    from ray.core.generated import gcs_pb2

    ip = ip or ray.util.get_node_ip_address()
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    nodes = [
        node_id.hex()
        for node_id, info in client.get_all_node_info(timeout=10).items()
        if info.state == alive and info.node_manager_address == ip
    ]
    if len(nodes) != 1:
        raise ConfigError(f"{len(nodes)} alive Ray nodes at {ip} ({', '.join(nodes) or 'none'}): name --node-id")
    return nodes[0]


def drain(client, node_id: str, notice: Notice) -> None:
    """Mark the node DRAINING with reason PREEMPTION and the notice's deadline (0: none given, Ray Train then
    allows 120 s). Ray accepts every preemption drain; a refusal is reported all the same."""
    from ray.core.generated import autoscaler_pb2

    accepted, why = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        notice.what,
        int(notice.deadline * 1000) if notice.deadline else 0,
        timeout=10,
    )
    if not accepted:
        raise AlbertDistError(f"Ray refused to drain node {node_id}: {why}")


def watch(
    source: AwsMetadata | GceMetadata,
    send: Callable[[Notice], None],
    interval_s: float,
    log: Callable[[str], None] = print,
    until: Callable[[], bool] = lambda: False,
) -> None:
    """Poll `source` and `send` each notice that outranks the one last sent; a failed read or drain is logged and
    tried again at the next poll."""
    sent: Notice | None = None
    while not until():
        try:
            notice = source.notice()
            if notice is not None and notice.outranks(sent):
                send(notice)
                sent = notice
                left = f"{notice.deadline - time.time():.1f} s before it goes" if notice.deadline else "no deadline"
                log(f"preemption watcher: node drained ({notice.what}; {left})")
        except Exception as err:  # noqa: BLE001 - the watcher outlives a failed read or drain: the next poll retries
            log(f"preemption watcher: {err}; trying again in {interval_s:g} s")
        time.sleep(interval_s)


def add_parser(commands) -> None:
    """`albert-dist cluster watch-preemption`."""
    cluster = commands.add_parser("cluster", help="run on a cluster's nodes").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    parser = cluster.add_parser(
        "watch-preemption",
        help="drain this node in Ray when the cloud announces its preemption",
        description="Polls the VM's metadata service (AWS IMDSv2: spot interruption and rebalance recommendation; "
        "GCE: preemption and host maintenance) and drains this machine's Ray node with reason PREEMPTION and the "
        "notice's deadline, so that a training run checkpoints before the VM goes. Runs until stopped; start it "
        "on every node that can be reclaimed. See docs/cluster.md.",
    )
    parser.add_argument("--cloud", choices=["auto", "aws", "gce"], default="auto")
    parser.add_argument("--address", help="GCS address host:port (default: the Ray this machine started)")
    parser.add_argument("--node-id", help="hex id of the node to drain (default: the alive node at this address)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    parser.add_argument(
        "--wait-for-metadata",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --cloud auto, how long to look for a metadata service before giving up (default 30; -1: "
        "for ever, for a sidecar that must not crash-loop where there is none)",
    )
    parser.add_argument("--aws-metadata-url", default=AWS_METADATA_URL)
    parser.add_argument("--gce-metadata-url", default=GCE_METADATA_URL)
    parser.add_argument(
        "--no-rebalance",
        dest="rebalance",
        action="store_false",
        help="leave AWS's rebalance recommendations alone (default: drain, with no deadline)",
    )
    parser.set_defaults(handler=_watch_command)


def _watch_command(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, got {args.interval}")
    if args.cloud == "auto":
        print("preemption watcher: looking for an instance metadata service (AWS, GCE)", flush=True)
    source = metadata_source(
        args.cloud, args.aws_metadata_url, args.gce_metadata_url, args.rebalance, args.wait_for_metadata, args.interval
    )
    print(f"preemption watcher: polling {source.base} every {args.interval:g} s", flush=True)

    def send(notice: Notice) -> None:
        import ray

        client = ray._raylet.GcsClient(address=gcs_address(args.address))
        drain(client, args.node_id or own_node_id(client), notice)

    watch(source, send, args.interval, log=lambda line: print(line, flush=True))
    return 0
