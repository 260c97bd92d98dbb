"""Hardware presets (dsml.net.presets): every number has a source, the α–β model of a link is
what its numbers say, and an unknown name is named."""
from __future__ import annotations

import math

import pytest

from dsml.net import presets
from dsml.net.alphabeta import AlphaBeta


@pytest.mark.parametrize("name", list(presets.LINKS))
def test_link_model_matches_its_numbers(name):
    link = presets.LINKS[name]
    assert link.bandwidth > 0 and link.alpha > 0 and link.source.strip()
    model = presets.network(name, gamma=1e-12)
    assert isinstance(model, AlphaBeta)
    assert model.alpha == link.alpha and math.isclose(model.beta, 1 / link.bandwidth)
    assert model.gamma == 1e-12


@pytest.mark.parametrize("name", list(presets.DEVICES))
def test_devices_have_a_rate_and_a_source(name):
    device = presets.DEVICES[name]
    assert device.flops > 1e12 and device.source.strip()


def test_unassumed_numbers_say_where_they_come_from_and_assumptions_say_so():
    for link in presets.LINKS.values():
        assert "assumed" in link.source          # every α is an order of magnitude, said so


def test_unknown_link_is_named():
    with pytest.raises(ValueError, match="unknown link 'token-ring'"):
        presets.network("token-ring")


# --- the two-level cluster (dgx_cluster) -----------------------------------------------------

def _ring_time(p, network, nbytes=8 * 2**20):
    import dsml
    from dsml.collectives import allreduce
    from dsml.comm.api import SizeOnly

    def program(comm):
        yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
    return dsml.run(program, p, network=network, trace=False).time


def test_new_link_latencies_come_from_one_source():
    near, far = presets.LINKS["nvlink3_nccl"], presets.LINKS["ib_hdr_nccl"]
    assert "tuning.cc" in near.source and "tuning.cc" in far.source
    assert near.alpha < far.alpha and near.bandwidth > far.bandwidth   # NVLink wins on both


def test_one_node_is_a_flat_nvlink_network():
    assert math.isclose(_ring_time(8, presets.cluster_for(8)),
                        _ring_time(8, presets.network("nvlink3_nccl")), rel_tol=1e-12)


def test_across_nodes_a_ring_runs_at_its_infiniband_hops():
    # Snake order: every crossing between nodes is one rail link, so the ring's time is the
    # flat InfiniBand ring's, whatever the NVLink inside.
    for nodes in (2, 4):
        p = 8 * nodes
        assert math.isclose(_ring_time(p, presets.dgx_cluster(nodes)),
                            _ring_time(p, presets.network("ib_hdr_nccl")), rel_tol=1e-9)
    # With an odd number of nodes the closing step takes two hops, and costs more.
    assert _ring_time(24, presets.dgx_cluster(3)) > _ring_time(24, presets.network("ib_hdr_nccl"))


def test_neighbours_in_rank_order_are_one_hop_apart():
    topology = presets.dgx_cluster(4)
    for rank in range(len(topology.hosts) - 1):
        assert len(topology.route(rank, rank + 1)) == 1
    assert len(topology.route(len(topology.hosts) - 1, 0)) == 1     # even node count: closes


def test_cluster_for_rounds_up_to_whole_nodes():
    assert len(presets.cluster_for(5).hosts) == 5
    assert len(presets.cluster_for(9).hosts) == 16
    assert len(presets.cluster_for(16).hosts) == 16


def test_dgx_cluster_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown link 'token-ring'"):
        presets.dgx_cluster(2, inter="token-ring")
    with pytest.raises(ValueError, match="nodes ≥ 1"):
        presets.dgx_cluster(0)
