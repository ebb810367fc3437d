"""The join algorithm on hand-made profiler trees (plain data, hand-computed times)."""

from __future__ import annotations

import pytest

from flopcount.profiling._tree import Node, align, attribute, clean_children, cpu_total, top_ops


def _n(name, self_cpu, *children, shapes=((2, 3),)):
    node = Node(name, 0.0, 0.0, self_cpu=self_cpu, shapes=tuple(shapes), children=list(children))
    return node


def _timed(roots):
    # give every node increasing start times in preorder, as the profiler does
    clock = [0.0]

    def visit(node):
        node.start = clock[0]
        clock[0] += 1
        for c in node.children:
            visit(c)
        node.end = clock[0]

    for r in roots:
        visit(r)
    return roots


def test_markers_say_which_events_a_top_level_op_carries():
    # the recorder's range lies inside the op's own node (below its dispatcher entry):
    # reshape -> clone -> flopcount#0 -> copy_, reshape -> view -> flopcount#1;
    # a composite's range encloses the top-level op: flopcount#2 -> linear -> t, addmm
    join = _timed([
        _n("aten::reshape", 1,
           _n("aten::clone", 1, _n("flopcount#0", 0, _n("aten::copy_", 4))),
           _n("aten::view", 1, _n("flopcount#1", 0))),
        _n("flopcount#2", 0, _n("aten::linear", 1, _n("aten::t", 1), _n("aten::addmm", 10))),
        _n("aten::ones_like", 3),
    ])
    tops = top_ops(join)
    assert [t.node.name for t in tops] == ["aten::reshape", "aten::linear", "aten::ones_like"]
    assert [t.events for t in tops] == [[0, 1], [2], []]
    # each event's node by its path of child positions, the marker ranges spliced out
    assert tops[0].owners == [(0, (0,)), (1, (1,))]
    assert [c.name for c in clean_children(tops[0].node.children[0])] == ["aten::copy_"]


def test_several_events_share_a_node_by_their_own_subtrees():
    join = _timed([
        _n("aten::reshape", 1,
           _n("aten::clone", 1, _n("flopcount#0", 0, _n("aten::copy_", 4))),
           _n("aten::view", 1, _n("flopcount#1", 0))),
    ])
    (carried,) = top_ops(join)
    timed = _timed([_n("aten::reshape", 3, _n("aten::clone", 1, _n("aten::copy_", 5)), _n("aten::view", 2))])[0]
    shares = attribute(timed, carried, cpu_total)
    # own subtrees 6 and 2, the wrapper's own 3 shared in proportion: 6 + 3*6/8, 2 + 3*2/8
    assert shares == {0: pytest.approx(8.25), 1: pytest.approx(2.75)}
    assert sum(shares.values()) == pytest.approx(cpu_total(timed))


def test_alignment_reads_in_place_as_out_of_place_and_finds_swaps():
    join = [("aten::linear", ((2, 3),)), ("aten::add", ((2, 3), (2, 3))), ("aten::view", ()), ("aten::t", ()), ("aten::relu", ())]
    timed = [("aten::linear", ((2, 3),)), ("aten::add_", ((2, 3), (2, 3))), ("aten::_fused", ()), ("aten::relu", ())]
    found = align(join, timed)
    assert found.pairs == {0: 0, 1: 1, 3: 4}
    assert found.swaps == [([2, 3], [2])]
