"""Correctness of the benchmark problems (``tape.bench``): objectives and derivatives against
ADBench's published reference values, and every tool against the hand-written one.
Tiny sizes, no timing."""

import numpy as np
import pytest

from tape.bench import adbench, ba, gmm, lstm, njit_loop, second, simple
from tape.bench.backends import peer_of
from tape.bench.common import backend
from tape.bench.harness import Opts, Skip, flat, rel_err, run_case

DATA = adbench.find_data_dir()
needs_data = pytest.mark.skipif(
    DATA is None, reason="no ADBench data (shared/adbench or $TAPE_ADBENCH_DIR)"
)
RTOL = 1e-8


def grad_of(builder):
    impl = builder()
    return impl.value_np(impl.value()), impl.grad_np(impl.grad())


def peer_builders(builders):
    """The builders of the installed peers (the others are skipped)."""
    out = {}
    for tool, b in builders.items():
        if peer_of(tool):
            try:
                backend(peer_of(tool))
            except Skip:
                continue
        out[tool] = b
    return out


def needs(peer):
    try:
        backend(peer)
        missing = False
    except Skip:
        missing = True
    return pytest.mark.skipif(missing, reason=f"{peer} is not installed (the peers extra)")


# ------------------------------------------------------------------ simple problems


def test_linreg_matches_the_lesson():
    bs = simple.linreg_cases(Opts())[0].builders
    for tool in ("tape", "tape eager", "njit (hand)"):
        v, g = grad_of(bs[tool])
        assert rel_err(v, simple.LINREG["value"]) <= RTOL, tool
        assert rel_err(g, simple.LINREG["grad"]) <= RTOL, tool


@pytest.mark.parametrize("problem", ["rosenbrock", "mlp", "mlp-large"])
def test_tape_agrees_with_hand_written(problem):
    cases = {
        "rosenbrock": lambda: simple.rosenbrock_cases(Opts(quick=True))[:2],
        "mlp": lambda: simple.mlp_cases(Opts()),
        "mlp-large": lambda: simple.mlp_large_cases(Opts()),
    }[problem]()
    for case in cases:
        hv, hg = grad_of(case.builders["njit (hand)"])
        for tool in ("tape", "tape eager"):
            v, g = grad_of(case.builders[tool])
            assert rel_err(v, hv) <= RTOL and rel_err(g, hg) <= RTOL, (case.label, tool)


def test_rosenbrock_peers_agree():
    case = simple.rosenbrock_cases(Opts(quick=True))[0]
    hv, hg = grad_of(case.builders["njit (hand)"])
    for tool, b in peer_builders(case.builders).items():
        v, g = grad_of(b)
        assert rel_err(v, hv) <= RTOL and rel_err(g, hg) <= RTOL, tool


def test_peer_of_names_the_peer_a_tool_needs():
    assert [peer_of(t) for t in ("jax jacfwd", "casadi", "drjit", "torch", "tape compiled",
                                 "njit (hand)", "tape njit_gradient")] == [
        "jax", "casadi", "drjit", "torch", None, None, None]  # fmt: skip


@needs("drjit")
def test_drjit_traces_once_and_agrees_on_every_size():
    """The frozen gradient is recorded at the first call and replayed after (a re-trace per
    call would time Dr.Jit's tracer, not its kernels)."""
    for case in simple.rosenbrock_cases(Opts(quick=True)):
        hv, hg = grad_of(case.builders["njit (hand)"])
        impl = case.builders["drjit"]()
        for _ in range(3):
            g = impl.grad_np(impl.grad())
        assert impl.frozen.n_recordings == 1, case.label
        assert rel_err(g, hg) <= RTOL and rel_err(impl.value_np(impl.value()), hv) <= RTOL


@needs("casadi")
def test_casadi_derivatives_agree_with_tape_and_a_plain_call():
    """CasADi's gradient, HVP, Hessian and Jacobian (through ``Function.buffer``) against
    tape's and, for the buffer's column-major layout, against CasADi's own plain call of a
    non-symmetric Jacobian."""
    import casadi as ca

    import tape as tp

    case = simple.rosenbrock_cases(Opts(quick=True))[0]
    hv, hg = grad_of(case.builders["njit (hand)"])
    v, g = grad_of(case.builders["casadi"])
    assert rel_err(v, hv) <= RTOL and rel_err(g, hg) <= RTOL

    rng = np.random.default_rng(0)
    x, v, A = rng.uniform(-1.0, 2.0, 7), rng.standard_normal(7), rng.standard_normal((7, 7))
    t = second._record(simple.rosenbrock, [x], ())
    tm = tp.record(lambda x: second.mixed(backend("tape"), [x], [tp.tensor(A)]), x)
    refs = {"hvp": (simple.rosenbrock, (), t.hvp(x, v=(v,))),
            "hessian": (simple.rosenbrock, (), t.hessian(x)),
            "jacobian": (second.mixed, (A,), tm.jacobian(x))}  # fmt: skip
    for what, (f, consts, ref) in refs.items():
        impl = second.casadi_derivative(f, x, consts, what, v)()
        assert rel_err(impl.grad_np(impl.grad()), flat(ref)) <= RTOL, what
    _, (xs,), y = second.casadi_symbols(second.mixed, [x], (A,))
    plain = np.asarray(ca.Function("j", [xs], [ca.jacobian(y, xs)])(x))
    impl = second.casadi_derivative(second.mixed, x, (A,), "jacobian")()
    assert rel_err(impl.grad_np(impl.grad()), plain) <= 1e-14


def test_calls_tools_agree_with_a_hand_written_reference():
    """Every case of ``calls`` (each transform of Rosenbrock n=10 from Python): each installed
    tool's result against the hand-written gradient (and, for the HVP, the Hessian of
    Rosenbrock written out; for the JVP, the gradient times the direction)."""
    cases = second.calls_cases(Opts())
    x = np.random.default_rng(0).uniform(-1.0, 2.0, 10)
    v = np.random.default_rng(1).standard_normal(10)
    g = np.empty(10)
    value = njit_loop.hand_grad(x, g)
    H = np.zeros((10, 10))
    for i in range(9):  # 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2
        H[i, i] += 1200.0 * x[i] ** 2 - 400.0 * x[i + 1] + 2.0
        H[i, i + 1] -= 400.0 * x[i]
        H[i + 1, i] -= 400.0 * x[i]
        H[i + 1, i + 1] += 200.0
    want = {"forward": [value], "gradient": g, "value_and_grad": g, "jvp": [g @ v], "vjp": g,
            "hvp": H @ v}  # fmt: skip
    assert [c.label.split()[0] for c in cases] == list(second.CALLS)
    for case in cases:
        what = case.label.split()[0]
        for tool, b in peer_builders(case.builders).items():
            impl = b()
            assert rel_err(impl.grad_np(impl.grad()), want[what]) <= RTOL, (what, tool)


def test_njit_loop_tools_agree_and_report_per_gradient_times():
    """The tools of ``njit-loop`` pass the harness's agreement check at n=10 (one short timing
    round: the per-gradient times are there, the numbers are not checked)."""
    case = njit_loop.njit_loop_cases(Opts(quick=True))[0]
    tools = ("njit (hand)", "tape", "tape njit_gradient")  # "tape compiled": 4 s more compiling
    opts = Opts(min_time=1e-4, budget=0.001, min_repeats=1, max_repeats=1, tools=tools)
    res = run_case(case, opts)
    assert set(res["tools"]) == set(tools)
    for tool, info in res["tools"].items():
        assert info["status"] == "ok" and info["grad_err"] <= RTOL, (tool, info)
        assert info["grad"]["repeats"] == 1 and "compile_s" in info


# ------------------------------------------------------------------ GMM


@needs_data
def test_gmm_objective_reference_values():
    t = adbench.read_gmm(DATA / "gmm" / "test.txt")
    f = gmm.make_objective(t.d, t.K, t.n, t.gamma, t.m)
    assert (
        rel_err(f(backend("numpy"), [t.alphas, t.means, t.icf], gmm.consts_for(t)), gmm.TEST_VALUE)
        <= RTOL
    )
    for subset, d, K in (("1k", 2, 5), ("1k", 10, 5)):
        data = adbench.read_gmm(DATA / "gmm" / subset / f"gmm_d{d}_K{K}.txt")
        assert (data.d, data.K, data.n) == (d, K, 1000)  # read from the header
        f = gmm.make_objective(data.d, data.K, data.n, data.gamma, data.m)
        v = f(backend("numpy"), [data.alphas, data.means, data.icf], gmm.consts_for(data))
        assert rel_err(v, gmm.reference_value(subset, d, K)) <= RTOL
        hand = gmm.hand_builder(data)()
        assert rel_err(hand.value(), gmm.reference_value(subset, d, K)) <= RTOL


@needs_data
def test_gmm_gradient_on_test_instance():
    t = adbench.read_gmm(DATA / "gmm" / "test.txt")
    for tool, b in peer_builders(gmm.builders(t)).items():
        v, g = grad_of(b)
        assert rel_err(v, gmm.TEST_VALUE) <= RTOL, tool
        assert rel_err(g, gmm.TEST_GRAD) <= RTOL, tool


@needs_data
def test_gmm_tape_matches_hand_on_a_real_instance():
    data = adbench.read_gmm(DATA / "gmm" / "1k" / "gmm_d10_K5.txt")
    bs = gmm.builders(data)
    hv, hg = grad_of(bs["njit (hand)"])
    v, g = grad_of(bs["tape"])
    assert rel_err(v, gmm.reference_value("1k", 10, 5)) <= RTOL
    assert rel_err(g, hg) <= RTOL


# ------------------------------------------------------------------ BA


@needs_data
def test_ba_jacobian_rows_on_test_instance():
    t = adbench.read_ba(DATA / "ba" / "test.txt")
    assert (t.n, t.m, t.p) == (2, 10, 10)
    rx, ry, we = ba.RESIDUALS["test"]
    for tool, b in peer_builders(ba.builders(t, per_obs=True)).items():
        v, J = grad_of(b)
        blocks = J[: 30 * t.p].reshape(t.p, 2, 15)
        assert rel_err(blocks[:, 0], np.tile(ba.TEST_ROW_X, (t.p, 1))) <= RTOL, tool
        assert rel_err(blocks[:, 1], np.tile(ba.TEST_ROW_Y, (t.p, 1))) <= RTOL, tool
        assert rel_err(J[30 * t.p :], np.full(t.p, ba.TEST_WERR_ROW)) <= RTOL, tool
        assert rel_err(v, np.concatenate([np.tile([rx, ry], t.p), np.full(t.p, we)])) <= 1e-10, tool


@needs_data
def test_ba_residuals_of_ba1():
    data = adbench.read_ba(adbench.ba_files(DATA)[0][1])
    rx, ry, we = ba.RESIDUALS["ba"]
    out, werr = ba.ba_objective_njit(data.cams, data.X, data.w, data.obs, data.feats)
    p = data.p
    assert rel_err(out[0], np.full(p, rx)) <= 1e-10 and rel_err(out[1], np.full(p, ry)) <= 1e-10
    assert rel_err(werr, np.full(p, we)) <= 1e-10


# ------------------------------------------------------------------ LSTM


@needs_data
def test_lstm_objective_reference_value():
    data = adbench.read_lstm(DATA / "lstm" / "lstm_l2_c1024.txt")
    assert (data.l, data.c, data.b) == (2, 1024, 14)
    f = lstm.make_objective(data.l, data.c, data.b)
    v = f(backend("numpy"), [data.main_params, data.extra_params], (data.state, data.sequence))
    assert rel_err(v, lstm.REFERENCE[(2, 1024)]) <= RTOL


@needs_data
def test_lstm_tape_gradient_head():
    data = adbench.read_lstm(DATA / "lstm" / "lstm_l2_c1024.txt")
    v, g = grad_of(lstm.builders(data)["tape"])
    assert rel_err(v, lstm.REFERENCE[(2, 1024)]) <= RTOL
    assert g.shape == (266,)
    assert rel_err(g[: len(lstm.GRAD_HEAD)], lstm.GRAD_HEAD) <= RTOL


@needs_data
def test_lstm_peers_agree_on_a_short_sequence():
    data = adbench.read_lstm(DATA / "lstm" / "lstm_l2_c1024.txt")
    data.sequence, data.c = data.sequence[:20], 20
    bs = peer_builders(lstm.builders(data))
    rv, rg = grad_of(bs.pop("tape"))
    for tool, b in bs.items():
        v, g = grad_of(b)
        assert rel_err(v, rv) <= RTOL and rel_err(g, rg) <= RTOL, tool


# ------------------------------------------------------------------ the harness


def test_harness_checks_and_times_without_error():
    case = simple.rosenbrock_cases(Opts(quick=True))[0]
    opts = Opts(
        min_time=1e-4, budget=0.01, min_repeats=2, max_repeats=2, tools=("tape", "njit (hand)")
    )
    res = run_case(case, opts)
    assert set(res["tools"]) == {"tape", "njit (hand)"}
    for info in res["tools"].values():
        assert info["status"] == "ok"
        assert info["grad"]["repeats"] == 2
    assert res["tools"]["tape"]["grad"]["vs_tape"] == 1.0


def test_harness_reports_a_wrong_gradient():
    from tape.bench.harness import Case, Impl

    x = np.arange(3.0)
    case = Case("toy", "x", 3, {
        "njit (hand)": lambda: Impl(grad=lambda: 2 * x, value=lambda: (x * x).sum()),
        "tape": lambda: Impl(grad=lambda: 2 * x + 1e-6, value=lambda: (x * x).sum()),
    })  # fmt: skip
    res = run_case(case, Opts(min_time=1e-5, budget=0.001, min_repeats=1, max_repeats=1))
    assert res["tools"]["tape"]["status"] == "mismatch"
    assert "grad" not in res["tools"]["tape"]


def test_harness_reports_per_gradient_times_and_the_one_time_cost(monkeypatch):
    """On a fake clock (a build of 2 s, a grad() call of 1 ms computing 10 gradients): times
    are per gradient, ``compile`` is build + first call less one steady call, and the table
    shows it."""
    from tape.bench import harness
    from tape.bench.harness import Case, Impl, Problem, format_table

    clock = [0.0]

    def tick(dt, result=None):
        clock[0] += dt
        return result

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    x = np.arange(3.0)
    case = Case("toy", "x", 3, {
        "tape": lambda: tick(2.0, Impl(grad=lambda: tick(1e-3, 2 * x), batch=10)),
        "njit (hand)": lambda: Impl(grad=lambda: tick(1e-4, 2 * x)),
    })  # fmt: skip
    res = run_case(case, Opts(min_time=1e-2, budget=0.1, min_repeats=3, max_repeats=3))
    t, h = res["tools"]["tape"], res["tools"]["njit (hand)"]
    assert t["grad"]["median_s"] == pytest.approx(1e-4) and h["grad"]["median_s"] == pytest.approx(
        1e-4
    )
    assert t["compile_s"] == pytest.approx(2.0) and h["compile_s"] == pytest.approx(0.0, abs=1e-12)
    assert t["setup_s"] + t["first_s"] == pytest.approx(2.001)
    table = format_table(Problem("toy", "toy", "n", None), [res])
    assert "compile" in table.splitlines()[1]
    assert table.splitlines()[3].split()[-4:] == ["2", "s", "2", "s"]  # first, compile


def test_report_quotes_the_njit_loop_and_the_peers():
    from tape.bench.report import markdown, targets_njit_and_peers

    def case(size, **meds):
        tools = {k: {"status": "ok", "grad": {"median_s": v, "q25_s": v, "q75_s": v},
                     "compile_s": 0.5} for k, v in meds.items()}  # fmt: skip
        return {"case": f"n={size}", "size": size, "tools": tools, "notes": []}

    results = {
        "njit-loop": [
            case(
                10, **{"njit (hand)": 20e-9, "tape njit_gradient": 40e-9, "tape compiled": 400e-9}
            ),
            case(1000, **{"njit (hand)": 1e-6, "tape njit_gradient": 1.1e-6}),
        ],
        "rosenbrock": [case(10, **{"tape compiled": 1e-6, "drjit": 12e-6, "casadi": 0.5e-6})],
    }
    got = targets_njit_and_peers(results)
    assert [met for _, _, met in got] == [True, False, None]
    assert "40 ns, hand 20 ns (2.00x); tape compiled 400 ns (20.0x)" == got[0][1]
    assert "drjit 12.0 us (12.0x tape, compile 500 ms)" in got[2][1]
    meta = {"date": "d", "cpu": "c", "cpus": 2, "platform": "p", "python": "3", "numpy": "2",
            "numba": "0", "scipy": "1", "peers": {}}  # fmt: skip
    md = markdown({"meta": meta, "results": results, "skipped": []})
    assert "## Issue 35 targets" in md
    assert (
        "| inside @njit, Rosenbrock n=1000: t.njit_gradient <= 1.05x hand @njit | 1.1 us, hand 1.0 us (1.10x)"
        in md
    )


def test_threads_option_pins_the_process_to_that_many_cpus():
    """``--threads N`` restricts the benchmark process to N CPUs (XLA sizes its own pool and
    ignores the thread flags); run in a child process, so this one keeps its CPUs."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a Linux process allowed on two CPUs or more")
    code = (
        "import os; from tape.bench.cli import _pin, machine_info; _pin(1); "
        "print(len(os.sched_getaffinity(0)), machine_info()['cpus_used'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_flat_accepts_tuples_and_tensors():
    import tape as tp

    assert flat((np.ones(2), tp.tensor([[3.0]]))).tolist() == [1.0, 1.0, 3.0]


def test_report_quotes_the_eager_and_cold_start_runs(tmp_path):
    import json

    from tape.bench.report import side_targets

    assert side_targets(str(tmp_path)) == []  # no side runs: nothing to quote
    run = dict(cold_first_gradient_s=4.0, cold_float32_after_float64_s=6.0,
               warm_first_gradient_s=0.9, warm_import_s=0.5)  # fmt: skip
    (tmp_path / "cold_start.json").write_text(json.dumps(dict(
        cpu="cpu X", date="2026-12-01T00:00:00+00:00", eager_op_us=3.0, default=run,
        compiled=dict(run, cold_first_gradient_s=25.0), demo=dict(first_line_s=1, total_s=40),
        suite=dict(wall_s=600, peak_rss_mib=2048, exit_status=0),
        compiled_tier=dict(gmm_compile_s=4.0, lstm_compile_s=12.0, memory_per_compiled_tape_mib=2.0),
    )))  # fmt: skip
    loops = {
        "polynomial": {
            "tape": {"seconds": 0.9, "loss": 1.0},
            "torch": {"seconds": 1.0, "loss": 1.0},
        },
        "mlp_adam": {"tape": {"seconds": 2.0, "loss": 1.0}, "torch": {"seconds": 1.0, "loss": 1.0}},
        "scalar_chain": {
            "tape": {"seconds": 1.0, "loss": 1.0, "us_per_op": 6.0},
            "torch": {"seconds": 1.0, "loss": 1.0, "us_per_op": 7.0},
        },
    }
    (tmp_path / "eager_loops.json").write_text(
        json.dumps(dict(cpu="cpu X", date="2026-12-01T00:00:00+00:00", loops=loops))
    )
    got = {
        label.split(":")[0].split(" <=")[0]: met for label, _, met in side_targets(str(tmp_path))
    }
    assert got == {
        "first gradient of record(rosen) with default settings from empty caches": True,  # 4 s
        "first gradient with compile=True from empty caches": False,  # 25 s > 5 s
        "float32 after float64 from empty caches, default settings": False,  # 6 s > 5 s
        "import + first gradient with a warm cache": True,
        "README's demo from empty caches": False,  # 40 s > 30 s
        "README's test command from empty caches": True,  # 10 min, 2 GB
        "compiled tier": False,  # GMM 4 s, but LSTM 12 s > 10 s
        "process memory per compiled tape (20 small distinct tapes)": True,  # 2 MiB
        "eager scalar op chain": True,  # 3 us forward
        "eager scalar op chain, backward included (reported)": None,
        "issue 11": True,  # 0.9x
        "eager MLP with Adam vs PyTorch (reported)": None,
    }


def test_merged_runs_keep_each_problem_from_one_run_and_say_so():
    from tape.bench import merge, report

    def doc(date, cpu, problems):
        meta = {"date": date, "cpu": cpu, "cpus": 2, "platform": "p", "python": "3", "numpy": "2",
                "numba": "0", "scipy": "1", "peers": {}, "elapsed_s": 10.0,
                "argv": ["python", "-m", "tape.bench", *problems]}  # fmt: skip
        cases = {"gmm": ["1k", "10k"], "hvp": ["a"], "ba": ["b"], "lstm": ["c"]}
        results = {p: [{"case": c, "run": date} for c in cases[p]] for p in problems}
        if date == "2026-12-02":
            results["gmm"] = results["gmm"][:1]  # re-ran one case
        return {"meta": meta, "skipped": [], "results": results}

    new = doc("2026-12-02", "X", ["gmm", "lstm"])
    old = doc("2026-12-01", "X", ["gmm", "hvp", "ba"])
    out = merge.merge(new, old, "older code")
    got = {k: [(r["case"], r["run"]) for r in v] for k, v in out["results"].items()}
    assert got == {"gmm": [("1k", "2026-12-02"), ("10k", "2026-12-01")], "lstm": [("c", "2026-12-02")],
                   "hvp": [("a", "2026-12-01")], "ba": [("b", "2026-12-01")]}  # fmt: skip
    assert out["meta"]["merged"][0]["problems"] == ["gmm (10k)", "hvp", "ba"]
    md = report.markdown({**out, "results": {}})
    assert ("- from another run (2026-12-01, 10 s, `python -m tape.bench gmm hvp ba`): "
            "gmm (10k), hvp, ba (older code)") in md  # fmt: skip
    with pytest.raises(ValueError, match="different machines"):
        merge.merge(new, doc("2026-12-01", "Y", ["hvp"]))
    # merging into a merge: each case keeps the run it came from (also as files without
    # "cases" said it, in their "problems" lines)
    newer = doc("2026-12-03", "X", ["lstm"])
    for prev in (
        out,
        {
            **out,
            "meta": {
                **out["meta"],
                "merged": [
                    {k: v for k, v in m.items() if k != "cases"} for m in out["meta"]["merged"]
                ],
            },
        },
    ):
        out2 = merge.merge(newer, prev, "n2")
        runs = [(m["date"], m["problems"], m["note"]) for m in out2["meta"]["merged"]]
        assert runs == [("2026-12-01", ["gmm (10k)", "hvp", "ba"], "older code"),
                        ("2026-12-02", ["gmm (1k)"], "n2")]  # fmt: skip
        got = {k: [(r["case"], r["run"]) for r in v] for k, v in out2["results"].items()}
        assert got["gmm"] == [("1k", "2026-12-02"), ("10k", "2026-12-01")]
        assert got["lstm"] == [("c", "2026-12-03")]


def test_tools_are_chosen_by_full_name_or_by_peer(monkeypatch, tmp_path):
    """``--tools jax`` runs every JAX tool; tape's variants are chosen by their full names;
    a name that matches no tool of the chosen problems stops the run with the tools it has."""
    from tape.bench import cli
    from tape.bench.harness import tool_selected

    assert tool_selected("jax jit", ("jax",)) and tool_selected("jax jacfwd", ("tape", "jax"))
    assert tool_selected("tape", ("tape",)) and not tool_selected("tape sparse", ("tape",))
    assert not tool_selected("jax jit", ("tape", "jax jacfwd"))
    monkeypatch.setenv("TAPE_CACHE_DIR", str(tmp_path))  # (main sets one where none is set)
    assert cli.main(["linreg", "--tools", "tape,jaxx", "--no-progress"]) == 2
