"""Pictures of a tape: :meth:`tape.Tape.to_dot` writes Graphviz source of the Wengert list.

One node per entry (its index, op, output shape and the source line that recorded it), one per
argument (differentiated ones filled), constants as small grey nodes (a scalar shows its
value), guards as red diamonds, outputs as double octagons; edges run from the entry (or
argument) that wrote a buffer to the entries that read it. Render with ``dot -Tsvg``.
"""

from __future__ import annotations

from tape.layout.columns import B_ALIAS, B_KIND, CONST, E_IN0, E_OUT


def _q(text):
    """A Graphviz double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(t, max_entries=5000) -> str:
    """Graphviz source of tape ``t`` (raises ``ValueError`` past ``max_entries`` entries:
    pictures of longer tapes are unreadable; pass a larger limit to draw them anyway)."""
    from tape.program.callbacks import entry_name
    from tape.program.replay import is_guard

    if t._merged is not None:
        raise RuntimeError("to_dot: this tape was merged into another one")
    n = t.n_entries
    if n > max_entries:
        raise ValueError(
            f"to_dot: the tape has {n} entries, more than max_entries={max_entries}; pass "
            "to_dot(max_entries=...) to draw it anyway"
        )
    bufs = t.bufs
    lines = [
        "digraph tape {",
        '  rankdir=TB; node [shape=box, fontname="Helvetica", fontsize=10]; '
        'edge [fontname="Helvetica", fontsize=9];',
    ]
    writer = {}  # buffer (alias root) -> node name

    def root(b):
        a = int(bufs[b, B_ALIAS])
        return a if a >= 0 else int(b)

    wrt = set(t.wrt)
    for k, b in enumerate(t.inputs):
        name = t.input_names[k] if k < len(t.input_names) else f"x{k}"
        style = ', style=filled, fillcolor="#cfe2ff"' if k in wrt else ""
        lines.append(f"  in{k} [shape=ellipse{style}, label={_q(f'{name}: {t.shapes[b]}')}];")
        writer[root(b)] = f"in{k}"
    consts = set()
    for i in range(n):
        e = t.entries[i]
        name = entry_name(t, i)
        out = int(e[E_OUT])
        label = f"{i}: {name}\n{t.shapes[out]}"
        src = t.sources.get(i)
        if src:
            label += f"\n{src}"
        if is_guard(t, i):
            attrs = 'shape=diamond, color="#c00000", fontcolor="#c00000"'
        elif bufs[out, B_KIND] == CONST:
            attrs = 'color="#808080"'
        else:
            attrs = ""
        lines.append(f"  e{i} [{attrs + ', ' if attrs else ''}label={_q(label)}];")
        for c in range(E_IN0, E_OUT):
            b = int(e[c])
            if b < 0:
                continue
            src_node = writer.get(root(b))
            if src_node is None:
                src_node = f"c{root(b)}"
                if src_node not in consts:
                    consts.add(src_node)
                    v = t.value(root(b))
                    text = (
                        f"{v.reshape(()).item():.6g}"
                        if v.size == 1
                        else f"const {t.shapes[root(b)]}"
                    )
                    lines.append(
                        f'  {src_node} [shape=plaintext, fontcolor="#606060", label={_q(text)}];'
                    )
            lines.append(f"  {src_node} -> e{i};")
        writer[root(out)] = f"e{i}"
    for k, b in enumerate(t.outputs):
        lines.append(f"  out{k} [shape=doubleoctagon, label={_q(f'output {k}: {t.shapes[b]}')}];")
        src_node = writer.get(root(b))
        if src_node is not None:
            lines.append(f"  {src_node} -> out{k};")
    lines.append("}")
    return "\n".join(lines) + "\n"
