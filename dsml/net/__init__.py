"""Plumbing (hand-written): dsml.net — network models the simulator prices messages with."""
from dsml.net.alphabeta import AlphaBeta
from dsml.net.fit import fit_alpha_beta, half_performance_size
from dsml.net.saved import load_network, save_network
from dsml.net.topology import (CUT_THROUGH_HOP, HOST_OVERHEAD, Topology, bisection_bandwidth,
                               diameter, fat_tree, fully_connected, ring, star, torus2d, tree,
                               two_level)

__all__ = ["AlphaBeta", "Topology", "fit_alpha_beta", "half_performance_size", "diameter",
           "bisection_bandwidth", "ring", "star", "fully_connected", "tree", "torus2d",
           "two_level", "fat_tree", "load_network", "save_network", "CUT_THROUGH_HOP",
           "HOST_OVERHEAD"]
