"""Topology-aware allreduce on virtual grids, every algorithm, counts that do not divide."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("topology", ["1x4", "2x2", "4x1"])
@pytest.mark.parametrize("algo", ["auto", "ring", "rabenseifner", "recdoubling", "mpi"])
def test_grid_4_ranks(topology: str, algo: str) -> None:
    expect = {"1x4": "4", "2x2": "2x2", "4x1": "4"}[topology]  # extent-1 levels drop out
    proc = run_mpi(4, "topology.py", env={"DDL_TOPOLOGY": topology, "DDL_ALGO": algo,
                                          "EXPECT_TOPOLOGY": expect})
    assert ok_lines(proc, "topology") == 4


@pytest.mark.parametrize("topology,algo", [("3x2", "ring"), ("3x2", "rabenseifner"),
                                           ("2x3", "auto"), ("6", "rabenseifner")])
def test_grid_6_ranks_not_power_of_two(topology: str, algo: str) -> None:
    proc = run_mpi(6, "topology.py", env={"DDL_TOPOLOGY": topology, "DDL_ALGO": algo,
                                          "EXPECT_TOPOLOGY": topology})
    assert ok_lines(proc, "topology") == 6


def test_detected_topology_one_host_is_flat() -> None:
    proc = run_mpi(3, "topology.py", env={"EXPECT_TOPOLOGY": "3"})
    assert ok_lines(proc, "topology") == 3


def test_topology_product_mismatch_is_a_clear_error() -> None:
    proc = run_mpi(4, "topology.py", env={"DDL_TOPOLOGY": "3x2"}, check=False)
    assert proc.returncode != 0
    assert "DDL_TOPOLOGY=3x2 describes 6 ranks but the job has 4" in proc.stdout + proc.stderr


@pytest.mark.parametrize("leader", ["1", "0"])
def test_three_levels_with_and_without_node_leader(leader: str) -> None:
    proc = run_mpi(8, "topology.py", env={"DDL_TOPOLOGY": "2x2x2", "DDL_ALGO": "ring",
                                          "DDL_NODE_LEADER": leader,
                                          "EXPECT_TOPOLOGY": "2x2x2"})
    assert ok_lines(proc, "topology") == 8


@pytest.mark.parametrize("n,topology", [(6, "3x2"), (6, "2x3"), (8, "2x2x2"), (8, "4x2")])
def test_node_leader_pipeline_many_segments(n: int, topology: str) -> None:
    # 4 KiB segments: most counts cross many segments, 3 and 4 ranks per node make a
    # chain with middle ranks, in place and out of place, every dtype and op of the worker
    proc = run_mpi(n, "topology.py", env={"DDL_TOPOLOGY": topology, "DDL_SEGMENT": "4096",
                                          "IN_PLACE": "1", "EXPECT_TOPOLOGY": topology})
    assert ok_lines(proc, "topology") == n


@pytest.mark.parametrize("n,topology,algo,window,leader",
                         [(4, "2x2", "ring", "1", "1"), (6, "2x3", "rabenseifner", "2", "1"),
                          (6, "3x2", "auto", "3", "0"), (8, "2x2x2", "ring", "4", "1"),
                          (6, "2x3", "recdoubling", "2", "1")])
def test_exchanges_between_nodes_in_pieces(n: int, topology: str, algo: str, window: str,
                                           leader: str) -> None:
    # 1000-byte pieces (not a multiple of any element size): every exchange above the first
    # level travels as a window of many pieces, short last pieces, empty messages
    proc = run_mpi(n, "topology.py", env={"DDL_TOPOLOGY": topology, "DDL_ALGO": algo,
                                          "DDL_PIECE": "1000", "DDL_WINDOW": window,
                                          "DDL_NODE_LEADER": leader, "DDL_SEGMENT": "8192",
                                          "IN_PLACE": "1", "EXPECT_TOPOLOGY": topology})
    assert ok_lines(proc, "topology") == n
