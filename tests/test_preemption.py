"""The preemption watcher reads each cloud's notices as its metadata service serves them (real HTTP on loopback,
tokens and headers enforced), and drains once per notice that brings the deadline forward. The drain of a real Ray
node is tests/test_faults_preemption.py."""

from __future__ import annotations

import threading
import time

import pytest
from metadata_server import FakeMetadata

from albert_dist.cli import main
from albert_dist.cluster.preemption import AwsMetadata, GceMetadata, Notice, metadata_source, watch
from albert_dist.errors import ConfigError


@pytest.fixture
def fake():
    with FakeMetadata() as server:
        yield server


def test_aws_spot_interruption_gives_its_time_as_the_deadline_through_an_imdsv2_token(fake):
    aws = AwsMetadata(fake.url)
    assert aws.notice() is None
    fake.instance_action = {"action": "terminate", "time": "2026-12-06T08:22:00Z"}
    notice = aws.notice()
    assert notice.deadline == 1796545320.0 and "terminate at 2026-12-06T08:22:00Z" in notice.what
    assert fake.refused == 0  # every read carried the token
    fake.expire_tokens()  # an expired token is refused once, then a fresh one is fetched
    assert aws.notice() == notice and fake.refused == 1


def test_aws_rebalance_recommendation_has_no_deadline_and_can_be_left_alone(fake):
    fake.rebalance = {"noticeTime": "2026-12-06T08:17:00Z"}
    assert AwsMetadata(fake.url).notice() == Notice("AWS rebalance recommendation of 2026-12-06T08:17:00Z", None)
    assert AwsMetadata(fake.url, rebalance=False).notice() is None
    fake.instance_action = {"action": "stop", "time": "2026-12-06T08:22:00Z"}  # the interruption comes first
    assert AwsMetadata(fake.url).notice().deadline == 1796545320.0


def test_gce_preemption_and_terminating_maintenance_get_their_documented_windows_from_first_sight(fake):
    gce = GceMetadata(fake.url)
    fake.maintenance_event = "MIGRATE_ON_HOST_MAINTENANCE"  # live migration: the VM stays
    assert gce.notice() is None
    fake.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
    before = time.time()
    maintenance = gce.notice()
    assert before + 60 <= maintenance.deadline <= time.time() + 60
    time.sleep(0.05)
    assert gce.notice() == maintenance  # the deadline stays that of the first sight
    fake.preempted = "TRUE"
    preempted = gce.notice()
    assert preempted.what == "GCE preemption" and preempted.deadline <= time.time() + 30
    assert fake.refused == 0


def test_auto_finds_the_cloud_that_answers_and_refuses_where_none_does(fake):
    silent = "http://127.0.0.1:9"  # discard: nothing listens
    assert isinstance(metadata_source("auto", fake.url, silent, True), AwsMetadata)
    assert isinstance(metadata_source("auto", silent, fake.url, True), GceMetadata)
    with pytest.raises(ConfigError, match="no instance metadata"):
        metadata_source("auto", silent, silent, True)
    started = time.monotonic()  # a metadata service that comes up late is waited for
    with FakeMetadata() as late:
        late_url = late.url
    found = []
    waiter = threading.Thread(target=lambda: found.append(metadata_source("auto", silent, late_url, True, -1, 0.05)))
    waiter.start()
    time.sleep(0.3)
    host, port = late_url.removeprefix("http://").split(":")
    with FakeMetadata((host, int(port))):
        waiter.join(timeout=10)
    assert isinstance(found[0], GceMetadata) and time.monotonic() - started >= 0.3


def test_watch_drains_once_per_notice_that_brings_the_deadline_forward_and_retries_a_failed_drain(fake):
    polls, sent, log = [], [], []
    script = [
        lambda: None,
        lambda: setattr(fake, "rebalance", {"noticeTime": "2026-12-06T08:17:00Z"}),  # drained, no deadline
        lambda: None,  # the same notice: no second drain
        lambda: setattr(fake, "instance_action", {"action": "terminate", "time": "2026-12-06T08:22:00Z"}),
        lambda: None,  # the drain fails (GCS away): tried again at the next poll
        lambda: None,
        lambda: None,
    ]
    failures = iter([False, True, False])

    def send(notice):
        if next(failures):
            raise ConnectionError("GCS unreachable")
        sent.append(notice)

    def until():
        if len(polls) == len(script):
            return True
        script[len(polls)]()
        polls.append(1)
        return False

    watch(AwsMetadata(fake.url), send, 0.001, log=log.append, until=until)
    assert [n.deadline for n in sent] == [None, 1796545320.0]
    assert sum("node drained" in line for line in log) == 2
    assert any("GCS unreachable; trying again" in line for line in log), log


def test_the_cli_says_in_one_line_when_no_metadata_answers(capsys):
    silent = "http://127.0.0.1:9"
    args = ["--aws-metadata-url", silent, "--gce-metadata-url", silent, "--wait-for-metadata", "0"]
    assert main(["cluster", "watch-preemption", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("albert-dist: error: no instance metadata") and "\n" not in err
