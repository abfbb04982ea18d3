"""The generated modules must match the registry (Numba's cache would otherwise serve old
code); each op's module is fingerprinted on its own rules; the sweeps dispatch through the
address tables and refuse what they cannot run; every op record holds the facts the rest of
the package reads from it; tape/ops imports nothing above it."""

import ast
import dataclasses
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

import tape as tp
from tape.interpreter import codegen as _codegen
from tape.interpreter import dispatch as _dispatch
from tape.interpreter.generated import sweeps
from tape.layout import fingerprint as _fingerprint
from tape.ops import registry

OPS_DIR = _fingerprint.PKG / "ops"


def test_generated_modules_are_fresh():
    assert sweeps.FINGERPRINT == _fingerprint.sweeps_fingerprint(), (
        "run `python -m tape.interpreter.codegen`"
    )
    for path, text in _codegen.generate().items():
        assert path.read_text() == text, (
            f"{path.name} is stale: run `python -m tape.interpreter.codegen`"
        )


def test_check_command_exit_status():
    r = subprocess.run(
        [sys.executable, "-m", "tape.interpreter.codegen", "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_sweeps_name_no_op():
    # the sweeps dispatch through the address table: no op's name or code is in their text
    text = _codegen.TARGET.read_text()
    for op in registry.OPS:
        for kind in ("fwd", "rev", "tan", "hrev"):
            assert f"_{kind}_{op.name}" not in text, op.name


def test_every_op_has_its_entry_functions():
    for op in registry.OPS:
        mod = _dispatch.op_module(op.code)
        assert mod.FINGERPRINT == _fingerprint.op_fingerprint(op)
        assert callable(getattr(mod, f"_fwd_{op.name}")), op.name
        has_rev = any(op.differentiable)
        for kind in ("rev", "tan", "hrev"):
            assert hasattr(mod, f"_{kind}_{op.name}") == has_rev, (op.name, kind)


def test_each_op_has_its_own_fingerprint():
    fps = [_fingerprint.op_fingerprint(op) for op in registry.OPS]
    assert len(set(fps)) == len(fps)


def test_a_constant_a_rule_reads_changes_that_ops_fingerprint_only(monkeypatch):
    from tape.ops import elementwise

    by = registry.BY_NAME
    before = {n: _fingerprint.op_fingerprint(by[n]) for n in ("erf", "erfc", "exp", "mul")}
    monkeypatch.setattr(elementwise, "TWO_OVER_SQRT_PI", elementwise.TWO_OVER_SQRT_PI * 2)
    after = {n: _fingerprint.op_fingerprint(by[n]) for n in before}
    assert after["erf"] != before["erf"] and after["erfc"] != before["erfc"]
    assert after["exp"] == before["exp"] and after["mul"] == before["mul"]


def _square_sum_tape():
    x = np.array([1.0, 2.0, 3.0])
    t = tp.record(lambda x: (x * x).sum(), x)
    t.gradient(x)  # prepares mul and sum
    return t, t.workspace()


def test_an_unprepared_op_raises_instead_of_running():
    t, ka = _square_sum_tape()
    tab = _dispatch.TABLES[np.dtype(np.float64)]
    code = registry.BY_NAME["mul"].code
    slots = slice(code * _dispatch.NCLS, (code + 1) * _dispatch.NCLS)  # every entry class
    saved = tab[_dispatch.FWD, slots].copy()
    tab[_dispatch.FWD, slots] = _dispatch.NOT_PREPARED
    try:
        with pytest.raises(RuntimeError, match="not prepared"):
            tp.kernels.forward(ka)
    finally:
        tab[_dispatch.FWD, slots] = saved
    assert tp.kernels.forward(ka) == -1


def test_an_op_code_outside_the_instruction_set_raises():
    t, ka = _square_sum_tape()
    entries = ka.entries.copy()
    for bad in (registry.OPS[-1].code + 1, _dispatch.MAX_OPS, -7):
        entries[0, 0] = bad
        with pytest.raises((RuntimeError, ValueError)):
            sweeps.forward_sweep(entries, ka.bufs, ka.ipool, ka.data, 0, ka.n_entries)


def test_sweeps_refuse_arrays_the_kernels_do_not_take():
    t, ka = _square_sum_tape()

    @njit
    def strided(ka):
        return sweeps.forward_sweep(ka.entries, ka.bufs, ka.ipool, ka.data[::2], 0, ka.n_entries)

    with pytest.raises(TypingError, match="kernel takes"):
        strided(ka)


def test_kernels_run_through_the_table_match_their_direct_call():
    # the same entry through the table (the sweep) and called by name (eager mode's path)
    t, ka = _square_sum_tape()
    data = ka.data.copy()
    assert sweeps.forward_sweep(ka.entries, ka.bufs, ka.ipool, data, 0, ka.n_entries) == -1
    again = ka.data.copy()
    for i in range(ka.n_entries):
        assert sweeps.FWD[int(ka.entries[i, 0])](i, ka.entries, ka.bufs, ka.ipool, again) == -1
    np.testing.assert_array_equal(data, again)


def test_registry_records_are_consistent():
    dunders = {}
    for k, op in enumerate(registry.OPS):
        assert op.code == k and registry.BY_NAME[op.name] is op
        assert not registry.missing_facts(op), f"op {op.name!r}: {registry.missing_facts(op)}"
        for d in op.operators + op.reflected:
            assert d not in dunders, f"{d} is claimed by ops {dunders[d]!r} and {op.name!r}"
            dunders[d] = op.name


def _record(**change):
    fwd = registry.BY_NAME["exp"]
    kernel = registry.BY_NAME["take"]
    op = dataclasses.replace(kernel if change.pop("kernel", False) else fwd, code=-1)
    return dataclasses.replace(op, **change)


def test_the_specialiser_drops_the_branches_constant_flags_rule_out():
    # binary_rev_flat for class one0 (input 0 one value): the summed path for input 0, the
    # per-element path for input 1, and no trace of the others in the generated text
    from tape.interpreter.codegen import HREV_ARGS, REV_ARGS
    from tape.interpreter.specialize import Specializer

    spec = Specializer(["mul_rev0", "mul_rev1"])
    text = spec.entry(
        "_rev_mul_c1",
        "loops.binary_rev_flat(mul_rev0, mul_rev1, True, True, True, False, i, entries, bufs, "
        "ipool, data, grad)",
        REV_ARGS,
    )
    for dead in ("True", "False", "else", "x0[j]", "q0", "mul_rev1(x0"):
        assert dead not in text, dead
    assert "p0 += masked(mul_rev0(c0, x1[j]" in text and "g1[j] +=" in text
    # forward-over-reverse with input 1 one value: no flag left, one copy of the template it
    # calls (_hrev_one) per input's rules
    spec = Specializer(["mul_rev0", "mul_rev1", "mul_h0", "mul_h1", "mul_h2"])
    text = spec.entry(
        "_hrev_mul_c5",
        "loops.binary_hrev_flat(mul_rev0, mul_rev1, mul_h0, mul_h1, mul_h2, True, True, True, "
        "True, True, False, True, i, entries, bufs, ipool, data, grad, T, GT)",
        HREV_ARGS,
    )
    assert "True" not in text and "False" not in text
    assert len([s for s in spec.sources if "def _hrev_one" in s]) == 2  # the loop, for 0 and 1


@pytest.mark.parametrize(
    "change, says",
    [
        (dict(ref=None), "NumPy reference"),
        (dict(check=None), "no check"),
        (dict(rev=()), "reverse rules"),
        (dict(differentiable=(True, True)), "differentiable"),
        (dict(dtype="widest"), "dtype rule"),
        (dict(dtype=("like", (1,))), "dtype rule"),
        (dict(operators=("add",)), "dunder"),
        (dict(reflected=("__rexp__",)), "reflected operators need two inputs"),
        (dict(domain=(1.0, -1.0)), "domain"),
        (dict(domains=((0.0, 1.0), (0.0, 1.0))), "domains"),
        (dict(masks=(1,)), "masks"),
        (dict(kinks=((1, -1),)), "kink"),
        (dict(tol=(1e-12,)), "tol"),
        (dict(guard=True), "describe_failure"),
        (dict(kernel=True, gpu=None), "GPU kernel"),
        (dict(kernel=True, rev=(None,)), "no reverse kernel"),
    ],
)
def test_a_record_missing_a_fact_fails(change, says):
    problems = registry.missing_facts(_record(**change))
    assert any(says in p for p in problems), problems


# The op families (tape/ops/<family>.py, not the layer's shared modules: the registry, the
# loops, vector maths, BLAS, validation) import only the layout, NumPy, Numba and the standard
# library; tests/test_layers.py checks the package's layers as a whole.
OPS_SHARED = {"__init__", "registry", "loops", "vmath", "blas", "masked", "validate"}
OPS_MAY_IMPORT = {
    "tape.ops.registry",
    "tape.layout.calls",
    "tape.layout.columns",
    "tape.layout.config",
    "tape.ops.loops",
    "tape.ops.validate",
    "tape.ops.vmath",
    "tape.ops.blas",
}
NEVER = {"tape", "tape.frontend.tensor", "tape.frontend.functional", "tape.program.core"}


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.module == "tape":  # from tape import registry: the submodule
                yield from (f"tape.{a.name}" for a in node.names)
            else:
                yield node.module


@pytest.mark.parametrize(
    "path",
    sorted(p for p in OPS_DIR.glob("*.py") if p.stem not in OPS_SHARED),
    ids=lambda p: p.name,
)
def test_ops_import_nothing_above_them(path):
    for name in _imports(path):
        top = name.split(".")[0]
        assert name not in NEVER, f"{path.name} imports {name}"
        if top == "tape":
            assert name in OPS_MAY_IMPORT or name.split(".")[:2] == ["tape", "ops"], (
                f"{path.name} imports {name}: tape/ops may import only {sorted(OPS_MAY_IMPORT)}"
            )
        else:
            assert top in {"numba", "numpy"} or top in sys.stdlib_module_names, (
                f"{path.name} imports {name}"
            )


def test_helpers_for_compiled_callers_refuse_calls_from_python():
    """The op kernels' loops and helpers compile without entries for Python callers
    (``tape.layout.calls.compiled_only``): compiled code calls them as any function, and a
    call from Python raises TypeError instead of jumping through the missing entry."""
    from tape.interpreter.generated.ops import sub
    from tape.layout.calls import CompiledOnly
    from tape.ops import loops

    assert isinstance(loops.total, CompiledOnly) and isinstance(sub._bcast_rev_rows_0, CompiledOnly)
    with pytest.raises(TypeError, match="compiled code only"):
        loops.total(np.arange(5.0))

    @njit
    def total(x):
        return loops.total(x)

    v = np.random.default_rng(2).standard_normal(1001)
    assert total(v) == pytest.approx(float(np.sum(v)), rel=1e-13, abs=1e-13)


HELPERS_CHILD = """
import numpy as np
from tape.interpreter import dispatch as D, warm as W
from tape.registry import BY_NAME

def stats(names, kind):
    fns = [D.function(D.KIND_NAMES[kind], BY_NAME[n].code) for n in names]
    return ([sum(f.stats.cache_hits.values()) for f in fns],
            [sum(f.stats.cache_misses.values()) for f in fns])

# a helper compiles square and sqrt while this process holds sqrt's lock: it skips sqrt
held = W.JobLock(W.op_job(D.FWD, BY_NAME["sqrt"].code, np.float32))  # any dtype's
assert held.try_acquire()
assert W.submit([W.op_job(D.FWD, BY_NAME[n].code, np.float64) for n in ("square", "sqrt")])
W.drain()
held.release()
D.prepare([BY_NAME[n].code for n in ("square", "sqrt")], np.float64, (D.FWD,))
print(stats(["square", "sqrt"], D.FWD))

# eager mode's first use of an op compiles its forward kernel here, and its reverse kernel
# goes to a helper at once: after the helper is done, backward() loads it from the cache
import tape as tp
x = tp.tensor(np.linspace(0.1, 0.9, 5), requires_grad=True)
y = tp.sinh(x)
W.drain()
y.sum().backward()
assert np.allclose(x.grad.numpy(), np.cosh(np.linspace(0.1, 0.9, 5)), rtol=1e-14)
print((stats(["sinh"], D.FWD), stats(["sinh"], D.REV)))
"""


def test_helper_processes_compile_cold_kernels_into_the_cache(tmp_path):
    # an empty Numba cache and one helper allowed
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), TAPE_COMPILE_WORKERS="1")
    r = subprocess.run(
        [sys.executable, "-c", HELPERS_CHILD], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    lines = [ast.literal_eval(line) for line in r.stdout.strip().splitlines()]
    # square: the helper's work, a cache hit here; sqrt: locked, so the helper left it
    assert lines[0] == ([1, 0], [0, 1]), lines[0]
    # sinh: forward compiled here, reverse compiled by the helper, loaded here
    assert lines[1] == (([0], [1]), ([1], [0])), lines[1]


DRIVER_CHILD = """
import numpy as np
import tape as tp
from tape.interpreter import warm as W
from tape.interpreter.generated import sweeps

x = np.linspace(0.1, 0.9, 5)
t = tp.record(lambda a: (a * a).sum(), x)  # its first kernel, cold, hands the driver over
W.drain()  # the helper has compiled it into the cache
g = t.gradient(x)
fb = sweeps.forward_backward
print(np.allclose(g, 2 * x), sum(fb.stats.cache_hits.values()), sum(fb.stats.cache_misses.values()))
"""


def test_a_helper_compiles_the_gradient_driver_while_a_cold_process_records(tmp_path):
    # the helper compiles forward_backward for the argument types a replay passes: the
    # gradient loads it from the cache (a compile here would be a miss)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), TAPE_COMPILE_WORKERS="1")
    r = subprocess.run(
        [sys.executable, "-c", DRIVER_CHILD], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "1", "0"], r.stdout


def _waits_on_a_flock(pid):
    with open("/proc/locks") as fh:  # a blocked waiter's line reads "N: -> FLOCK ... PID ..."
        return any("->" in ln and "FLOCK" in ln and f" {pid} " in ln for ln in fh)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads Linux's /proc/locks")
def test_a_kernel_locked_by_another_process_is_waited_for_and_then_loaded(tmp_path, monkeypatch):
    # another process compiling cos's forward kernel holds its lock: a process that needs the
    # kernel waits for it, then compiles it or loads it from the cache
    from tape.interpreter import warm as _warm
    from tape.ops.registry import BY_NAME

    code = BY_NAME["cos"].code
    marker = tmp_path / "released"  # written just before the lock is released
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # the child's cache: its locks
    lock = _warm.JobLock(_warm.op_job(0, code, np.float64))
    assert lock.try_acquire()
    monkeypatch.undo()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", "import os, numpy as np; from tape.interpreter import dispatch as D; "
             f"D.prepare([{code}], np.float64, (D.FWD,)); print(D.prepared(D.FWD, {code}, "
             f"np.float64), os.path.exists({str(marker)!r}))"],
            env=dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path)), stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2400):  # until the child blocks on the lock (a hang guard, not a timing)
            if _waits_on_a_flock(child.pid):
                break
            assert child.poll() is None, "the kernel was prepared while its lock was held"
            time.sleep(0.05)
        else:
            raise AssertionError("the child never waited for the lock")
        marker.write_text("")
    finally:
        lock.release()
    out, _ = child.communicate(timeout=300)
    # it finished after the release: the marker was there
    assert child.returncode == 0 and out.split() == ["True", "True"]


def test_op_records_say_what_the_compiled_tier_asks():
    # cheap implies vectorises; elementwise ops never stop a sweep; an op that can describe
    # a rejected input, or a guard, may stop it
    for op in registry.OPS:
        assert not op.cheap or op.vectorises, op.name
        if op.kind != "structural":
            assert not op.may_stop, op.name
        elif op.guard or op.describe_failure is not None:
            assert op.may_stop, op.name
    assert registry.BY_NAME["add"].cheap and not registry.BY_NAME["exp"].vectorises
    assert not registry.BY_NAME["cumsum"].may_stop and registry.BY_NAME["take"].may_stop


UNITS_CHILD = """
import numpy as np
import tape as tp
from tape.interpreter import warm as W; from tape.compiler import compiled as C

C.INLINE_KINDS = 0  # every fused loop in a unit module of its own

def f(x, w):
    h = tp.sin(x) * x + 1.0
    return (tp.tanh(h @ w) ** 2).sum()

x, w = np.linspace(0.1, 0.9, 12).reshape(3, 4), np.linspace(-1, 1, 8).reshape(4, 2)
t = tp.record(f, x, w, compile=False)
want = t.gradient(x, w)
# a helper compiles the tape's fused loops into Numba's cache; this process loads them
g = C.generate(t)
units, cells = g.units, g.cells
rev = {name: r for _, name, r in cells}
mods = {name: C.unit_module(text) for name, text in units.items()}
assert W.submit([W.unit_job(m.__file__, rev[n], t.dtype) for n, m in mods.items()])
W.drain()
t.compile()
got = t.gradient(x, w)
assert all(np.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(got, want))
print(len(mods), sum(sum(m.unit.stats.cache_hits.values()) for m in mods.values()),
      sum(sum(m.unit.stats.cache_misses.values()) for m in mods.values()))
"""


def test_a_helper_process_compiles_a_tapes_fused_loops_into_the_cache(tmp_path):
    # a new tape cache (the unit modules are new files, so Numba has nothing of them), and
    # the suite's Numba cache, where the interpreter's kernels that the recording runs are
    env = dict(os.environ, TAPE_CACHE_DIR=str(tmp_path / "tape"), TAPE_COMPILE_WORKERS="1")
    r = subprocess.run([sys.executable, "-c", UNITS_CHILD], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    n, hits, misses = (int(v) for v in r.stdout.split())
    assert n >= 2 and hits == n and misses == 0, (n, hits, misses)


RUNTIME_CHILD = """
import numpy as np
import tape as tp
from tape.interpreter import warm as W; from tape.compiler import compiled as C

def f(x, w):
    return (tp.sin(x) * w).sum()

x, w = np.linspace(0.1, 0.9, 6), np.linspace(1.0, 2.0, 6).reshape(2, 3)
t = tp.record(lambda x, w: f(x, w.reshape(6)), x, w, compile=False)
job = C.runtime_job(t)
assert job == "runtime float64 float64:1,float64:2", job
assert W.submit([job])  # a helper compiles the runtime's gradient for (1-d, 2-d) arguments
W.drain()
t.compile()
g = C.runtime().gradient_args_2
print(sum(g.stats.cache_hits.values()), sum(g.stats.cache_misses.values()))
"""


def test_a_helper_process_compiles_the_runtimes_gradient_for_a_recordings_arguments(tmp_path):
    # a new tape cache: the runtime's module is a new file there (see the test above)
    env = dict(os.environ, TAPE_CACHE_DIR=str(tmp_path / "tape"), TAPE_COMPILE_WORKERS="1")
    r = subprocess.run(
        [sys.executable, "-c", RUNTIME_CHILD], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "0"]  # loaded from the helper's work, not compiled here


# every binary op's class kernels are copies of the same templates (tape.ops.loops), with its
# rules bound: ops with each kind of rule (products, quotients, a mask, second partials of
# every pattern, no derivative) stand for them all (each op costs a dozen kernel compiles)
CLASS_OPS = [registry.BY_NAME[n] for n in ("mul", "div", "pow", "maximum", "less")]


# late: by then tests/test_ops.py and the background run of tests/test_derivatives.py have
# compiled these kernels into the suite's cache, so this loads them instead of compiling
# each a second time
@pytest.mark.late
@pytest.mark.parametrize("op", CLASS_OPS, ids=lambda o: o.name)
def test_class_kernels_give_the_general_kernels_numbers(op, rng):
    """A binary op's kernels of one entry class (equal sizes, a one-element first or second
    input, a first or second input that is a row or a column of the output) compute, element
    for element, what its general kernel does: forward values, input adjoints, tangents (one
    and three directions) and tangent adjoints compared bit for bit, on the same entry."""
    from tape.frontend.testing import sample_inputs
    from tape.layout.columns import CLASS_BASE, COL, ONE, ROW

    fn = getattr(tp, op.name)
    cases = [(0, ((6,), (6,))), (ONE, ((), (9,))), (CLASS_BASE * ONE, ((9,), ()))]
    # rows: long (vector loops) and short ones, leading unit axes, a unit axis inside
    cases += [(ROW, ((1, 9), (3, 9))), (CLASS_BASE * ROW, ((4, 2, 5), (2, 5))),
              (CLASS_BASE * ROW, ((3, 1, 3), (1, 3))), (ROW, ((3,), (2, 5, 3)))]  # fmt: skip
    # columns: runs in four running sums and in order, a unit axis inside, leading unit axes
    cases += [(COL, ((3, 1), (3, 9))), (CLASS_BASE * COL, ((4, 2), (4, 1))),
              (COL, ((2, 1, 1), (2, 3, 4))), (CLASS_BASE * COL, ((1, 6, 7), (6, 1)))]  # fmt: skip
    for cls, shapes in cases:
        xs = sample_inputs(op, shapes, rng)
        wrt = [k for k, d in enumerate(op.differentiable) if d]
        t = tp.record(lambda a, b: fn(a, b), *xs, wrt=wrt or None)
        n = t.n_entries
        (i,) = np.flatnonzero(t.entries[:n, 0] == op.code)
        e, bufs, ipool = t.entries, t.bufs, t.ipool
        assert _dispatch.entry_classes(e, bufs, ipool, np.array([i]))[0] == cls
        kinds = [("fwd", 1), ("rev", 1)]
        if cls in (0, ONE, CLASS_BASE * ONE):  # the rows' derivative entries are the general ones
            kinds += [("tan", 1), ("tan", 3), ("hrev", 1), ("hrev", 3)]
        for kind, k in kinds:
            general = _dispatch.function(kind, op.code)
            own = _dispatch.function(kind, op.code, cls)
            if general is None:
                assert own is None
                continue
            assert own is not general, (op.name, kind, cls)
            arenas = []
            k_of = _dispatch.KIND_NAMES.index(kind)
            for f in (_dispatch.Kernel(general, k_of), _dispatch.Kernel(own, k_of)):
                data = t.data.copy()
                draw = np.random.default_rng(1)
                grad = draw.standard_normal(data.shape[0])
                grad[bufs[e[i, 4], 0]] = 0.0  # a zero output adjoint adds exactly zero
                T = draw.standard_normal((k, data.shape[0]))
                GT = draw.standard_normal((k, data.shape[0]))
                if kind == "fwd":
                    data[bufs[e[i, 4], 0] :] = np.nan  # the output, written by the kernel
                    f(i, e, bufs, ipool, data)
                    arenas.append(data)
                elif kind == "rev":
                    f(i, e, bufs, ipool, data, grad)
                    arenas.append(grad)
                elif kind == "tan":
                    f(i, e, bufs, ipool, data, T)
                    arenas.append(T)
                else:
                    f(i, e, bufs, ipool, data, grad, T, GT)
                    arenas.append(GT)
            np.testing.assert_array_equal(
                arenas[0], arenas[1], err_msg=f"{op.name} {kind} class {cls}, {k} directions"
            )
