"""ADBench data: locating the files, reading them, and the instance lists.

Formats and formulas: ``shared/adbench/README.md`` (copied from microsoft/ADBench). Sizes are
always read from the file headers, never from the file names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV_VAR = "TAPE_ADBENCH_DIR"


def find_data_dir(explicit=None) -> Path | None:
    """The ADBench data folder: ``explicit``, ``$TAPE_ADBENCH_DIR``, or ``shared/adbench`` beside
    (or above) the repository or the working directory. ``None`` if none exists."""
    cands = []
    if explicit:
        cands.append(Path(explicit))
    if os.environ.get(ENV_VAR):
        cands.append(Path(os.environ[ENV_VAR]))
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, *here.parents]:
        cands.append(base / "shared" / "adbench")
    for c in cands:
        if (c / "gmm").is_dir() or (c / "ba").is_dir() or (c / "lstm").is_dir():
            return c
    return None


# ------------------------------------------------------------------ GMM


@dataclass
class GMMData:
    d: int
    K: int
    n: int
    alphas: np.ndarray  # (K,)
    means: np.ndarray  # (K, d)
    icf: np.ndarray  # (K, d(d+1)/2)
    x: np.ndarray  # (n, d)
    gamma: float
    m: int
    name: str = ""

    @property
    def n_params(self) -> int:
        return self.alphas.size + self.means.size + self.icf.size


def read_gmm(path, replicate_point=False) -> GMMData:
    tok = Path(path).read_text().split()
    d, K, n = map(int, tok[:3])
    v = tok[3:]
    s = d * (d + 1) // 2
    alphas = np.array(v[:K], float)
    o = K
    means = np.array(v[o : o + K * d], float).reshape(K, d)
    o += K * d
    icf = np.array(v[o : o + K * s], float).reshape(K, s)
    o += K * s
    npts = 1 if replicate_point else n
    x = np.array(v[o : o + npts * d], float).reshape(npts, d)
    o += npts * d
    if replicate_point:
        x = np.repeat(x, n, axis=0)
    gamma, m = float(v[o]), int(v[o + 1])
    return GMMData(d, K, n, alphas, means, icf, x, gamma, m, name=Path(path).stem)


def gmm_files(data_dir, subset):
    """``[(label, path)]`` for the GMM instances of ``subset`` ('1k' or '10k'), sorted by d, K."""
    folder = Path(data_dir) / "gmm" / subset
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob("gmm_d*_K*.txt"):
        mt = re.match(r"gmm_d(\d+)_K(\d+)", p.stem)
        if mt:
            out.append(((int(mt.group(1)), int(mt.group(2))), p))
    return [(f"{subset} d{d} K{K}", p) for (d, K), p in sorted(out)]


# ------------------------------------------------------------------ BA


@dataclass
class BAData:
    n: int
    m: int
    p: int
    cams: np.ndarray  # (n, 11)
    X: np.ndarray  # (m, 3)
    w: np.ndarray  # (p,)
    obs: np.ndarray  # (p, 2) int64: camera, point
    feats: np.ndarray  # (p, 2)
    name: str = ""


def read_ba(path) -> BAData:
    tok = Path(path).read_text().split()
    n, m, p = map(int, tok[:3])
    v = np.array(tok[3:], float)
    cams = np.tile(v[0:11], (n, 1))
    X = np.tile(v[11:14], (m, 1))
    w = np.full(p, v[14])
    feats = np.tile(v[15:17], (p, 1))
    obs = np.stack([np.arange(p) % n, np.arange(p) % m], axis=1).astype(np.int64)
    return BAData(n, m, p, cams, X, w, obs, feats, name=Path(path).stem)


def ba_files(data_dir):
    folder = Path(data_dir) / "ba"
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob("ba*_n*_m*_p*.txt"):
        mt = re.match(r"ba(\d+)_", p.stem)
        out.append((int(mt.group(1)), p))
    return [(f"ba{k}", p) for k, p in sorted(out)]


# ------------------------------------------------------------------ LSTM


@dataclass
class LSTMData:
    l: int
    c: int
    b: int
    main_params: np.ndarray  # (2l, 4b)
    extra_params: np.ndarray  # (3, b)
    state: np.ndarray  # (2l, b)
    sequence: np.ndarray  # (c, b)
    name: str = ""

    @property
    def n_params(self) -> int:
        return self.main_params.size + self.extra_params.size


def read_lstm(path) -> LSTMData:
    tok = Path(path).read_text().split()
    l, c, b = map(int, tok[:3])
    v = np.array(tok[3:], float)
    o = 0

    def take(rows, cols):
        nonlocal o
        a = v[o : o + rows * cols].reshape(rows, cols)
        o += rows * cols
        return a

    main = take(2 * l, 4 * b)
    extra = take(3, b)
    state = take(2 * l, b)
    seq = take(c, b)
    return LSTMData(l, c, b, main, extra, state, seq, name=Path(path).stem)


def lstm_files(data_dir):
    folder = Path(data_dir) / "lstm"
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob("lstm_l*_c*.txt"):
        mt = re.match(r"lstm_l(\d+)_c(\d+)", p.stem)
        out.append(((int(mt.group(1)), int(mt.group(2))), p))
    return [(f"l{l} c{c}", p) for (l, c), p in sorted(out)]
