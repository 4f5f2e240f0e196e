import pytest

from pettingllms.core import AgentGraph


def test_parallel_and_sequential():
    assert AgentGraph.parallel(["a", "b"]).stages(0) == (("a", "b"),)
    assert AgentGraph.sequential(["a", "b"]).stages(3) == (("a",), ("b",))
    assert AgentGraph((("a", "b"), ("c",))).agents == ("a", "b", "c")


def test_invalid_graphs():
    with pytest.raises(ValueError):
        AgentGraph(())
    with pytest.raises(ValueError, match="more than one stage"):
        AgentGraph((("a",), ("a",)))


def test_restricted_to_keeps_order_and_rejects_unknown():
    g = AgentGraph((("a", "b"), ("c",)))
    assert g.restricted_to(["c", "a"]).stage_list == (("a",), ("c",))
    with pytest.raises(ValueError):
        g.restricted_to(["z"])
