"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 41
from typing import NamedTuple

from dsml.net.alphabeta import AlphaBeta


class Link(NamedTuple):
    """A network link: bandwidth per direction (B/s), a typical small-message latency α (s),
    and where the numbers come from."""
    name: str
    bandwidth: float
    alpha: float
    source: str


class Device(NamedTuple):
    """An accelerator: peak dense FLOP/s for training arithmetic, and its source."""
    name: str
    flops: float
    source: str


LINKS = {
    "nvlink3": Link("NVLink 3 (A100, per GPU, one direction)", 300e9, 3e-6,
                    "NVIDIA A100 datasheet (2020): 3rd-generation NVLink, 600 GB/s per GPU over 12 "
                    "links, both directions together; α: NCCL's own latency constants for NVLink "
                    "rings span 0.4–5.7 µs by protocol (nccl src/graph/tuning.cc), 3 µs assumed"),
    "ib_hdr": Link("InfiniBand HDR (200 Gb/s)", 25e9, 1.5e-6,
                   "NVIDIA DGX SuperPOD cabling guide: HDR is 4 lanes of 50 Gb/s; α: 1.2 µs "
                   "one-byte RDMA latency over HDR (Azure HBv3 performance documentation), "
                   "1.5 µs assumed for MPI"),
    "eth_10g": Link("10 Gigabit Ethernet", 1.25e9, 30e-6,
                    "IEEE Std 802.3ae-2002 (10 Gb/s); α: 10 µs at best for TCP over 10 GbE "
                    "(Larsen et al., SBAC-PAD 2007), about 25 µs typical for MPI over TCP; 30 µs "
                    "assumed"),
}

DEVICES = {
    "a100": Device("NVIDIA A100 SXM4 (dense BF16/FP16)", 312e12,
                   "NVIDIA A100 datasheet (2020): 312 TFLOPS BF16/FP16 Tensor Core, dense "
                   "(624 with sparsity)"),
}


# -- cell 42
def resnet50_layers():
    """ResNet-50 (torchvision's v1.5: the stride in each block's 3×3 convolution), one entry per
    parameter tensor in forward order: (name, number of parameters, forward FLOPs per 224×224
    example, counting a multiply-add as 2)."""
    tensors = []

    def conv(name, c_in, c_out, k, out_hw):
        tensors.append((f"{name}.weight", c_in * c_out * k * k, 2 * c_in * c_out * k * k * out_hw ** 2))

    def norm(name, c):
        tensors.extend([(f"{name}.weight", c, 0), (f"{name}.bias", c, 0)])  # FLOPs: negligible

    conv("conv1", 3, 64, 7, 112)
    norm("bn1", 64)
    c_in, hw = 64, 56                                   # after the 3×3 max-pool
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                     (512, 3, 2)], start=1):
        for block in range(blocks):
            name, s = f"layer{stage}.{block}", (stride if block == 0 else 1)
            out_hw = hw // s
            conv(f"{name}.conv1", c_in, width, 1, hw)
            norm(f"{name}.bn1", width)
            conv(f"{name}.conv2", width, width, 3, out_hw)
            norm(f"{name}.bn2", width)
            conv(f"{name}.conv3", width, 4 * width, 1, out_hw)
            norm(f"{name}.bn3", 4 * width)
            if block == 0:
                conv(f"{name}.downsample.0", c_in, 4 * width, 1, out_hw)
                norm(f"{name}.downsample.1", 4 * width)
            c_in, hw = 4 * width, out_hw
    tensors.append(("fc.weight", 2048 * 1000, 2 * 2048 * 1000))
    tensors.append(("fc.bias", 1000, 0))
    return tensors


def network(link: str, gamma: float = 0.0) -> AlphaBeta:
    """The α–β model of a preset link (a flat network of such links)."""
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; choose one of {', '.join(LINKS)}")
    return AlphaBeta(LINKS[link].alpha, 1.0 / LINKS[link].bandwidth, gamma)


# -- cell 43
import networkx as nx

from dsml.net.topology import Topology

NCCL_TUNING = ("NCCL's cost model, src/graph/tuning.cc (hwLat, Ring row, Simple protocol — the one "
               "that reaches full bandwidth; NVIDIA/nccl commit 01afd20)")
# Both latencies from one source: NCCL's own per-step ring latencies, for the same algorithm and
# protocol. (The older "nvlink3" and "ib_hdr" above take α from two different kinds of source.)
LINKS.update({
    "nvlink3_nccl": Link("NVLink 3 inside a DGX A100 (per GPU, one direction)", 300e9, 3.4e-6,
                         "NVIDIA A100 datasheet (2020): 600 GB/s per GPU, both directions "
                         f"together; α: 3.4 µs per ring step over NVLink in {NCCL_TUNING}, "
                         "assumed to be the α of one message"),
    "ib_hdr_nccl": Link("InfiniBand HDR between nodes (one 200 Gb/s port per GPU)", 25e9, 9.6e-6,
                        "NVIDIA DGX A100 user guide: eight single-port ConnectX-6 HDR (200 Gb/s) "
                        f"adapters for the compute fabric; α: 9.6 µs per ring step over the network "
                        f"in {NCCL_TUNING}, assumed to be the α of one message"),
})


def dgx_cluster(nodes: int, gpus_per_node: int = 8, intra: str = "nvlink3_nccl",
                inter: str = "ib_hdr_nccl", gamma: float = 0.0) -> Topology:
    """A two-level cluster like DGX A100 nodes: inside a node every pair of GPUs is joined
    directly by an `intra` link (NVSwitch gives each pair full NVLink bandwidth); between nodes
    GPU g of every node is joined to GPU g of every other node by an `inter` link (one network
    port per GPU, "rail-optimised" as in NVIDIA's DGX SuperPOD design, switches modelled as
    direct links). Ranks are numbered in a snake order (node 0's GPUs 0…7, node 1's 7…0, …) so
    that a ring crosses between nodes on a single rail link, as NCCL's rings do (with an even
    number of nodes; with an odd number the ring's closing step takes two hops)."""
    for name in (intra, inter):
        if name not in LINKS:
            raise ValueError(f"unknown link {name!r}; choose one of {', '.join(LINKS)}")
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need nodes ≥ 1 and gpus_per_node ≥ 1, got {nodes}, {gpus_per_node}")
    near, far = LINKS[intra], LINKS[inter]
    graph = nx.Graph()
    graph.add_nodes_from((n, g) for n in range(nodes) for g in range(gpus_per_node))
    for n in range(nodes):
        for a in range(gpus_per_node):
            for b in range(a + 1, gpus_per_node):
                graph.add_edge((n, a), (n, b), latency=near.alpha, bandwidth=near.bandwidth)
    for g in range(gpus_per_node):
        for n in range(nodes):
            for m in range(n + 1, nodes):
                graph.add_edge((n, g), (m, g), latency=far.alpha, bandwidth=far.bandwidth)
    hosts = [(n, g if n % 2 == 0 else gpus_per_node - 1 - g)
             for n in range(nodes) for g in range(gpus_per_node)]
    return Topology(graph, hosts, name=f"dgx_cluster({nodes}×{gpus_per_node})", gamma=gamma)


def cluster_for(p: int, gpus_per_node: int = 8, **links) -> Topology:
    """The smallest dgx_cluster with at least p GPUs (one node when p ≤ gpus_per_node)."""
    nodes = -(-p // gpus_per_node)
    return dgx_cluster(nodes, min(p, gpus_per_node), **links)
