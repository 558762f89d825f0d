"""An object store refusing every request (503 SlowDown) for a minute, met by one write: albert-dist's S3 client
(`storage.filesystem`, its retry budget `ALBERT_DIST_STORAGE_RETRY_S`, 100 s by default) against pyarrow's own
(the same filesystem without `storage.retrying_s3`: `AwsStandardS3RetryStrategy(max_attempts=3)`).

The store is moto's S3 server behind `tests/fault_proxy.py`, whose refusal window opens when the write starts.
Printed per client: whether the write went through, its wall time, and the proxy's own record of it (when the
first and the last refused attempt arrived, how many were refused, the status of the attempt after the window),
an independent measure of the same write. The tests ride out windows as long as their own shorter budget
(tests/test_s3_faults.py); this is the default budget against the 60 s window it is meant for, run once.

    .venv/bin/python benchmarks/bench_s3_refusal.py            # 60 s window, the default budget
    .venv/bin/python benchmarks/bench_s3_refusal.py --window 10 --budget 10
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_proxy import FaultProxy  # noqa: E402
from s3_server import moto_server, write_through_a_refusal  # noqa: E402

from albert_dist import storage  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds every request is refused")
    parser.add_argument("--budget", type=float, help=f"{storage.RETRY_ENV} (default: unset, {storage.DEFAULT_RETRY_S})")
    args = parser.parse_args()
    with moto_server() as env:
        import boto3

        os.environ.update(env)
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="albert-bench")
        proxy = FaultProxy(env["AWS_ENDPOINT_URL"])
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        if args.budget is None:
            os.environ.pop(storage.RETRY_ENV, None)
        else:
            os.environ[storage.RETRY_ENV] = str(args.budget)
        print(f"window {args.window:.0f} s, retry budget {storage.retry_budget():.0f} s")
        retrying = storage.retrying_s3
        results = {"albert-dist": write_through_a_refusal(proxy, "s3://albert-bench/a.json", args.window)}
        storage.retrying_s3 = lambda fs: fs  # pyarrow's client as `filesystem` opens it
        try:
            results["pyarrow default"] = write_through_a_refusal(proxy, "s3://albert-bench/b.json", args.window)
        finally:
            storage.retrying_s3 = retrying
        proxy.close()
    for client, r in results.items():
        times = ", ".join(
            f"{name} {r[key]:.1f} s"
            for name, key in (("first refused", "first_refused_s"), ("last refused", "last_refused_s"))
            if r[key] is not None
        )
        after = f"; next attempt at {r['next_attempt_s']:.1f} s: {r['next_status']}" if r["next_attempt_s"] else ""
        print(
            f"{client}: {'written' if r['written'] else 'FAILED'} after {r['wall_s']:.1f} s (wall); proxy: "
            f"{r['refused']} attempts refused ({times}){after}"
        )
        if r["error"]:
            print(f"  {r['error'][:300]}")


if __name__ == "__main__":
    main()
