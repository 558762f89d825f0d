"""Data preparation on a cluster of several nodes (a local `ray.cluster_utils.Cluster`: a head without CPUs and
two nodes of one CPU each): the tokenizer actors spread over the nodes and still leave every node room for the
read tasks that feed them, so the preparation ends instead of waiting for ever; and every process of that cluster
listens on loopback only."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from cluster_helpers import connect, loopback_cluster, run_own_cluster
from process_helpers import beyond_loopback, listeners_of, process_tree

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def main(corpus: Path, root: Path) -> None:
    import ray

    from albert_dist.data.config import DataJobConfig
    from albert_dist.data.prepare import prepare_dataset

    cluster = loopback_cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    connect(cluster)
    try:
        cfg = DataJobConfig.model_validate(
            {
                "run": {"output_dir": str(root)},
                "data": {"inputs": [str(corpus)], "format": "blocks", "max_seq_length": 64, "range_bytes": 50_000},
                "tokenizer": {"kind": "sentencepiece", "vocab_size": 1000},
            }
        )
        summary = prepare_dataset(cfg, log=print)
        listeners = sorted(listeners_of(process_tree(os.getpid())))
        print("RESULT " + json.dumps({"instances": summary["instances"], "documents": summary["documents"]}))
        print("LISTENERS " + json.dumps(listeners))
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_preparation_spread_over_two_one_cpu_nodes_ends(tmp_path, stdlib_corpus):
    out = run_own_cluster(__file__, [str(stdlib_corpus), str(tmp_path)], tmp_path, "dc-")
    result = json.loads(re.search(r"RESULT (\{.*\})", out)[1])
    assert result["instances"] > 100 and result["documents"] > 100, out[-6000:]
    assert int(re.search(r"in (\d+) range\(s\)", out)[1]) > 2, out[-6000:]  # many reads, in the nodes' spare room
    listeners = json.loads(re.search(r"LISTENERS (\[.*\])", out)[1])
    names = " ".join(name for _, _, name in listeners)
    assert names.count("raylet") >= 3 and "gcs_server" in names, listeners  # the sample saw all three nodes
    assert not beyond_loopback(listeners), f"listening beyond loopback: {beyond_loopback(listeners)}"


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
