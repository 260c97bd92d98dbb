"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 46
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


def network(link: str, gamma: float = 0.0) -> AlphaBeta:
    """The α–β model of a preset link (a flat network of such links)."""
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; choose one of {', '.join(LINKS)}")
    return AlphaBeta(LINKS[link].alpha, 1.0 / LINKS[link].bandwidth, gamma)
