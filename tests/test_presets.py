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
