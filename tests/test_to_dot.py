"""``Tape.to_dot``: Graphviz source of the Wengert list (issue: tape pictures)."""

import re
import shutil
import subprocess

import numpy as np
import pytest

import tape as tp

NODE = re.compile(r"^  (\w+) \[(.*)\];$")
EDGE = re.compile(r"^  (\w+) -> (\w+);$")


def _parse(src):
    """Nodes {name: attribute text} and edges [(a, b)] of to_dot's output; fails on any line
    that is neither."""
    lines = src.strip().splitlines()
    assert lines[0] == "digraph tape {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[2:-1]:
        m = NODE.match(line)
        if m:
            assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
            nodes[m.group(1)] = m.group(2)
            continue
        m = EDGE.match(line)
        assert m, f"not a node or an edge: {line!r}"
        edges.append((m.group(1), m.group(2)))
    for a, b in edges:
        assert a in nodes and b in nodes, (a, b)
    return nodes, edges


def _f(x, w):
    y = tp.tanh(x @ w)
    if y.sum() > 0:  # a guard
        y = y * 2.0
    return (y**2).sum() + 0.5


def test_every_entry_argument_guard_and_output_is_drawn(tmp_path):
    t = tp.record(_f, np.ones((2, 3)), np.ones(3), wrt=[1])
    path = tmp_path / "t.dot"
    src = t.to_dot(path)
    assert path.read_text() == src
    nodes, edges = _parse(src)
    entries = [n for n in nodes if n.startswith("e")]
    assert len(entries) == len(t)
    # the differentiated argument is filled, the other is not
    assert "fillcolor" in nodes["in1"] and "fillcolor" not in nodes["in0"]
    guards = [n for n, a in nodes.items() if "diamond" in a]
    assert len(guards) == 1 and "guard" in nodes[guards[0]]
    assert "test_to_dot.py" in nodes[guards[0]]  # the source line that recorded it
    # the output is fed by the last entry; every other entry but the guard feeds another
    assert (f"e{len(t) - 1}", "out0") in edges
    fed = {a for a, _ in edges}
    assert all(f"e{i}" in fed for i in range(len(t)) if f"e{i}" not in guards)
    # scalar constants show their values
    labels = " ".join(nodes.values())
    assert 'label="0.5"' in labels and 'label="2"' in labels


def test_eager_graph_and_quotes_in_names():
    x = tp.tensor([1.0, 2.0], requires_grad=True)
    y = (tp.exp(x) * x).sum()
    nodes, edges = _parse(y._tape.to_dot())
    ops = [a for n, a in nodes.items() if n.startswith("e")]
    assert any("exp" in a for a in ops) and any("mul" in a for a in ops)
    t = tp.record(lambda z: (z * 3.0).sum(), np.ones(2))
    t.input_names[0] = 'a "quoted" name\\'
    nodes, _ = _parse(t.to_dot())
    assert '\\"quoted\\"' in nodes["in0"]


def test_long_tapes_need_an_explicit_limit():
    t = tp.record(lambda z: sum((z * float(k)).sum() for k in range(30)), np.ones(2))
    with pytest.raises(ValueError, match="max_entries"):
        t.to_dot(max_entries=10)
    _parse(t.to_dot(max_entries=1000))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_graphviz_renders_it(tmp_path):
    t = tp.record(_f, np.ones((2, 3)), np.ones(3))
    out = subprocess.run(["dot", "-Tsvg"], input=t.to_dot(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "<svg" in out.stdout
