"""The PyTorch-style front end: :class:`Tensor`, :func:`apply` (how every op is recorded) and
the constructors.

How recording works. A tensor either owns its value (a NumPy array: leaves, constants, results
computed without gradient tracking) or names a buffer of a :class:`~tape.core.Tape`. An op
whose inputs need gradients appends one entry to their tape (a fresh tape if they have none,
the union of their tapes if they have several) and runs the compiled forward sweep over just
that entry, so eager mode and replay share one set of rules. A leaf is copied into a tape the
first time the tape uses it; ``backward`` runs the compiled reverse sweep and adds the leaf
buffers' adjoints to each leaf's ``.grad``.

A tape lives as long as some tensor computed on it: a training loop that builds a fresh loss
each iteration frees the previous graph when the previous loss is dropped. As in PyTorch, a
second ``backward`` through the same graph raises unless the first passed
``retain_graph=True``.

In-place writes (``-=``, ``zero_()``, ``copy_``, ``fill_``, writes through ``.data``) bump a
tensor's version counter, shared with its views and detached aliases. A tape that copied the
tensor at an older version copies it again before the next op reads it; a graph already built
keeps the copy it used, so its ``backward`` gives the gradient of what was computed.
"""

from __future__ import annotations

import math
import operator
import threading
import weakref

import numpy as np

from tape.layout.columns import ACTIVE, B_ALIAS, B_KIND, B_OFF, B_SIZE, CONST, LEAF
from tape.layout.source import user_line
from tape.ops import registry
from tape.ops.blocks import broadcast
from tape.ops.blocks.copy import c_strides
from tape.ops.blocks.copy import encode as copy_block
from tape.ops.elementwise import STOP_GRADIENT
from tape.ops.guard import EQUAL, GUARD, INT, TRUTH
from tape.ops.movement import COPY
from tape.program import anomaly as _anomaly
from tape.program.core import Tape, resolve

float64 = np.dtype(np.float64)
float32 = np.dtype(np.float32)
int64 = np.dtype(np.int64)
int32 = np.dtype(np.int32)
bool_ = np.dtype(np.bool_)


_DEFAULT_FLOAT = [float64]  # set_default_dtype (process-wide, as in PyTorch)
_ONE = np.ones(1)  # the seed of backward() on a one-element tensor (never written)


def _quiet_numpy():
    """``(enter, leave)``: NumPy's floating-point warnings off and back on, as
    ``np.errstate(all="ignore")`` does (the kernels never warn, so NumPy references standing in
    for them must not either). Through NumPy's context variable when it has one: an
    ``errstate`` block is a large share of a small eager op (``benchmarks/MEASURED.md``)."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar as var
    except ImportError:  # another NumPy layout: the public (slower) way
        var = None
    if var is not None:
        with np.errstate(all="ignore"):
            quiet = var.get()
        return (lambda: var.set(quiet)), var.reset

    def enter():
        e = np.errstate(all="ignore")
        e.__enter__()
        return e

    return enter, lambda e: e.__exit__(None, None, None)


_quiet, _loud = _quiet_numpy()


def get_default_dtype():
    """The dtype Python floats and float constructors give: ``tape.float64`` unless changed
    with :func:`set_default_dtype` (PyTorch's default is float32; tape's is float64, which
    finite-difference checks need)."""
    return _DEFAULT_FLOAT[0]


def set_default_dtype(dtype):
    """Set the default floating-point dtype (``tape.float32`` or ``tape.float64``)."""
    dt = np.dtype(dtype)
    if dt not in (float32, float64):
        raise TypeError(
            f"set_default_dtype: only tape.float32 and tape.float64 are supported, got {dt}"
        )
    _DEFAULT_FLOAT[0] = dt


class device:
    """Where a tensor lives, as ``torch.device``: ``device("cpu")``. Eager tensors live on
    the CPU; GPU work goes through recorded tapes (``Tape.to("cuda")``)."""

    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):  # noqa: A002
        if isinstance(type, device):
            type, index = type.type, type.index  # noqa: A001
        type = str(type)  # noqa: A001
        if ":" in type:
            type, _, ix = type.partition(":")  # noqa: A001
            index = int(ix)
        if type not in ("cpu", "cuda"):
            raise RuntimeError(
                f"Expected one of cpu, cuda device type at start of device string: {type}"
            )
        self.type = type
        self.index = index

    def __repr__(self):
        ix = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{ix})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        try:
            other = device(other)
        except (RuntimeError, TypeError, ValueError):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))


CPU = device("cpu")
_DEFAULT_DEVICE = [CPU]

CUDA_EAGER = (
    "eager tensors live on the CPU: tape runs on a GPU through recorded tapes. Record the "
    "function on CPU tensors (t = tape.record(fn, x)) and move the tape with t.to('cuda')"
)


def check_device(dev, what="tensor"):
    """``dev`` (None, a string or a :class:`device`) as a device eager tensors can live on."""
    if dev is None:
        return _DEFAULT_DEVICE[0]
    d = device(dev)
    if d.type != "cpu":
        raise RuntimeError(
            f"{what}: device={str(d)!r} is not available to eager tensors; {CUDA_EAGER}"
        )
    return d


def set_default_device(dev):
    """Set the device constructors use by default; only ``"cpu"`` is available to eager
    tensors (see ``Tape.to("cuda")`` for GPU replay)."""
    _DEFAULT_DEVICE[0] = check_device(dev, "set_default_device")


def get_default_device():
    """The device constructors use by default (``device("cpu")`` unless
    :func:`set_default_device` changed it), as ``torch.get_default_device``."""
    return _DEFAULT_DEVICE[0]


_device_cls = device


class _State(threading.local):
    """Per-thread state; class attributes are the defaults every thread starts with (a
    ``getattr`` with a default on a plain ``threading.local`` costs a caught AttributeError
    on every op)."""

    grad = True
    scratch = None
    open = None  # weakref to the newest eager tape made on this thread
    recordings = ()  # the tape.record() calls in progress on this thread, innermost last


def current_recording():
    """The innermost recording in progress on this thread (``None`` outside ``tape.record``)."""
    r = _state.recordings
    return r[-1] if r else None


def nested_in(inner, outer) -> bool:
    """Whether recording ``inner`` is ``outer`` or a sub-tape recorded inside it (by
    :func:`tape.checkpoint`, whose lifted inputs connect the two)."""
    while inner is not None:
        if inner is outer:
            return True
        lift = inner.lift
        inner = lift.parent if lift is not None else None
    return False


def _deeper(a, b):
    """Of two recordings an op mixes, the one nested in the other (a checkpoint's sub-tape
    reading a tensor of the recording around it); other pairs raise."""
    if nested_in(a, b):
        return a
    if nested_in(b, a):
        return b
    raise RuntimeError("an op mixes tensors from two different recordings")


_state = _State()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record gradients now (False inside :class:`no_grad` and
    :class:`inference_mode`), as ``torch.is_grad_enabled``."""
    return _state.grad


class no_grad:
    """Context manager (and decorator) that disables gradient tracking, as ``torch.no_grad``:
    results computed inside own their values and do not require grad."""

    def __enter__(self):
        self._prev = is_grad_enabled()
        _state.grad = False

    def __exit__(self, *exc):
        _state.grad = self._prev
        return False

    def __call__(self, fn):
        def wrapper(*a, **k):
            with no_grad():
                return fn(*a, **k)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        wrapper.__doc__ = fn.__doc__
        return wrapper


class set_grad_enabled(no_grad):
    """Context manager (and function) setting gradient tracking on or off, as
    ``torch.set_grad_enabled(mode)``: called plainly it sets the mode for the thread."""

    def __init__(self, mode):
        self._prev = is_grad_enabled()
        self.mode = bool(mode)
        _state.grad = self.mode

    def __enter__(self):
        _state.grad = self.mode

    def __exit__(self, *exc):
        _state.grad = self._prev
        return False


class inference_mode(no_grad):
    """``torch.inference_mode()``: here the same as :class:`no_grad` (``mode=False`` leaves
    tracking on)."""

    def __init__(self, mode=True):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = is_grad_enabled()
        _state.grad = not self.mode and self._prev


class enable_grad(no_grad):
    """Context manager that re-enables gradient tracking inside ``no_grad``."""

    def __enter__(self):
        self._prev = is_grad_enabled()
        _state.grad = True


class GradFn:
    """What produced a non-leaf tensor (PyTorch's ``grad_fn``); ``name`` is the op."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{''.join(p.capitalize() for p in self.name.split('_'))}Backward0>"


def _check_dtype(dt):
    dt = np.dtype(dt)
    if dt.kind == "c":
        raise TypeError("complex tensors are not supported")
    if dt.kind not in "biuf":
        raise TypeError(f"tensor: expected numeric data, got dtype {dt}")
    if dt.kind == "f" and dt.itemsize < 4:
        return float32
    if dt.kind in "iu":
        return int64
    return dt


_RETAINED: dict = {}
"""``id -> weakref`` of the non-leaf tensors whose gradient ``backward()`` keeps
(:meth:`Tensor.retain_grad`); by id, as tensors compare elementwise."""


class Size(tuple):
    """A tensor's shape (``x.shape``, ``x.size()``): a tuple of ints, printed as PyTorch prints
    its ``torch.Size`` (``torch.Size([2, 3])``), so that a script written for PyTorch prints
    the same lines. It equals the plain tuple, indexes, unpacks and hashes as one, and goes
    wherever NumPy takes a shape. ``numel()`` is the number of elements."""

    __slots__ = ()

    def __repr__(self):
        return f"torch.Size({list(self)})"

    __str__ = __repr__

    def numel(self) -> int:
        """The number of elements of a tensor of this shape."""
        return math.prod(self)

    def __reduce__(self):  # pickles (and deep-copies) as the tuple it is
        return (Size, (tuple(self),))


_SIZES: dict = {}  # shape -> its Size: tensors of one shape share one (a new one costs 0.3 us)


def _size(shape):
    """The :class:`Size` of ``shape`` (a tuple or a Size), made once per shape."""
    s = _SIZES.get(shape)
    if s is None:
        if len(_SIZES) > 4096:
            _SIZES.clear()
        s = _SIZES[shape] = tuple.__new__(Size, shape)
    return s


class Tensor:
    """An n-dimensional array that can record the operations applied to it.

    Create tensors with :func:`tensor`, :func:`zeros`, :func:`ones`, ... Attributes follow
    PyTorch: ``requires_grad``, ``grad``, ``is_leaf``, ``grad_fn``, ``shape`` (a :class:`Size`),
    ``ndim``, ``dtype`` (a NumPy dtype).
    """

    __slots__ = (
        "_tape", "_buf", "_value", "_base", "_last", "shape", "dtype", "_rg", "_grad", "_op", "_ver",
        "_copied", "__weakref__",
    )  # fmt: skip
    # NumPy's protocols (ufuncs, ``np.sum`` & co.): tape.frontend.numpy_api installs them
    __array_ufunc__ = None

    def __init__(self, value, requires_grad=False, _ver=None):
        self._tape = None
        self._buf = -1
        self._value = value
        self._ver = [0] if _ver is None else _ver  # version counter, shared by memory aliases
        self._base = None  # (leaf, offset) for a view of a leaf not yet used by any tape
        self._last = None  # weakref to the open eager tape this leaf was last copied into
        self.shape = _size(value.shape)
        self.dtype = value.dtype
        self._op = None
        self._grad = None
        self._rg = False
        self._copied = False  # a strided slice or transpose: a copy where PyTorch has a view
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _traced(cls, tp, buf, shape, dtype, requires_grad, op):
        t = cls.__new__(cls)
        t._tape = tp
        t._buf = buf
        t._value = None
        t._base = None
        t._last = None
        s = _SIZES.get(shape)
        t.shape = s if s is not None else _size(shape)
        t.dtype = dtype
        t._rg = requires_grad
        t._grad = None
        t._op = op
        t._ver = None
        t._copied = False
        return t

    # ------------------------------------------------------------ autograd attributes

    @property
    def requires_grad(self) -> bool:
        return self._rg

    @requires_grad.setter
    def requires_grad(self, flag):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad=True):
        """Set ``requires_grad`` in place (floating-point leaves only); returns ``self``."""
        if requires_grad and self.dtype.kind != "f":
            raise RuntimeError(
                f"only tensors of floating point dtype can require gradients (this one is {self.dtype})"
            )
        if self._op is not None and not requires_grad:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf tensors; use detach()"
            )
        flag = bool(requires_grad)
        if flag != self._rg and self._ver is not None:
            self._ver[0] += 1  # an open tape that copied it as a constant copies it again
        self._rg = flag
        return self

    @property
    def is_leaf(self) -> bool:
        return self._op is None

    @property
    def grad_fn(self):
        return None if self._op is None else GradFn(self._op)

    def _resolve(self):
        tp = self._tape
        if tp is not None and tp._merged is not None:
            self._tape, self._buf = resolve(tp, self._buf)
        return self._tape, self._buf

    # ------------------------------------------------------------ values

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grad(self):
        """The accumulated gradient (a leaf's, or a tensor's after :meth:`retain_grad`), or
        None. Assigning checks what PyTorch checks: a tensor of this shape and dtype, or None."""
        return self._grad

    @grad.setter
    def grad(self, g):
        if g is not None:
            if not isinstance(g, Tensor):
                raise TypeError(
                    f"assigned grad expected to be a Tensor or None but got grad of type "
                    f"{type(g).__name__}"
                )
            if g.shape != self.shape:
                raise RuntimeError(
                    f"assigned grad has data of a different size: {tuple(g.shape)}, the tensor's is "
                    f"{tuple(self.shape)}"
                )
            if g.dtype != self.dtype:
                raise RuntimeError(
                    f"assigned grad has data of a different type: {g.dtype}, the tensor's is "
                    f"{self.dtype}"
                )
        self._grad = g

    def retain_grad(self):
        """Keep this tensor's gradient in :attr:`grad` after ``backward()`` although it is not
        a leaf (PyTorch's); it accumulates over backward calls, as a leaf's does. A leaf keeps
        its gradient anyway."""
        if not self._rg:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._tape is not None and self._op is not None:
            if self._resolve()[0].recording:
                raise RuntimeError(
                    "retain_grad() inside tape.record(): a recorded tape gives the adjoint of "
                    "any value through t.vjp or by returning it"
                )
            k = id(self)
            _RETAINED[k] = weakref.ref(self, lambda _, k=k: _RETAINED.pop(k, None))

    @property
    def retains_grad(self) -> bool:
        """Whether :meth:`retain_grad` was called on this (non-leaf) tensor."""
        r = _RETAINED.get(id(self))
        return r is not None and r() is self

    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def size(self, dim=None):
        """The shape (PyTorch's ``size()``), or the length of axis ``dim``."""
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    def _arena_value(self):
        """The value: the owned array, or a view of the tape's arena (in the arena dtype)."""
        if self._tape is None:
            return self._value
        tp, b = self._resolve()
        if tp._written:
            stale(tp, [b])
        return tp.value(b)

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array (shares memory for owned values, a copy otherwise).

        Inside :func:`tape.record` the value leaves the tape: a guard is recorded, checked at
        every replay (see the guide "When replay is safe", ``docs/guides/replay_safety.md``).
        """
        if self._tape is None:
            return self._value
        v = self._peek()
        self._guard(EQUAL, v)
        return v

    def _peek(self):
        """The value as a NumPy array without recording a guard (internal reads): the owned
        array itself, or a fresh copy of a traced value."""
        if self._tape is None:
            return self._value
        return self._arena_value().astype(self.dtype, copy=True)

    def _guard(self, mode, value):
        """Inside a recording, record that this tensor's value left the tape as ``value``."""
        tp = self._tape
        if tp is None:
            return
        tp, b = self._resolve()
        if not tp.recording:
            return
        ref = tp.new_buffer(self.shape if mode != TRUTH else (), CONST, np.asarray(value, tp.dtype))
        out = tp.new_buffer((), CONST)
        i = tp.add_entry(GUARD.code, [b, ref], out, [mode])
        tp.sources[i] = user_line()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def _scalar(self, what):
        if self.numel() != 1:
            raise ValueError(
                f"{what}: only one-element tensors can be converted to Python scalars, got shape {tuple(self.shape)}"
            )
        return self._peek().reshape(()).item()

    def item(self):
        """The value of a one-element tensor as a Python number (a guard inside a recording)."""
        v = self._scalar("item()")
        self._guard(EQUAL, v)
        return v

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        v = int(self._scalar("int()"))
        self._guard(INT, v)
        return v

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise TypeError("only integer tensors can be used as an index")
        return self.__int__()

    def __bool__(self):
        if self.numel() != 1:
            raise RuntimeError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous"
            )
        v = bool(self._peek().reshape(()).item())
        self._guard(TRUTH, float(v))
        return v

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__

    def detach(self) -> Tensor:
        """A tensor with the same value that is not part of any graph.

        Inside :func:`tape.record` the value is taped (recomputed at every replay) with no
        gradient, rather than frozen at its recorded value.
        """
        if self._tape is None:
            return Tensor(self._value, _ver=self._ver)  # same memory: same version counter
        tp = self._resolve()[0]
        if tp.recording:
            return apply(STOP_GRADIENT, [self], self.shape, dtype=self.dtype)
        return Tensor(self._peek())

    @property
    def data(self) -> Tensor:
        """The value as a tensor outside the graph, sharing memory (and the version counter)
        with this one: in-place writes through it are seen by every later expression."""
        return self.detach()

    @data.setter
    def data(self, value):
        if self._tape is not None:
            raise RuntimeError("cannot assign .data of a tensor computed in a graph")
        v = np.array(value.numpy() if isinstance(value, Tensor) else value, dtype=self.dtype)
        self._value = v
        self.shape = _size(v.shape)
        self._bump()

    def _bump(self):
        self._ver[0] += 1

    def zero_(self):
        """Fill with zeros in place (owned tensors, such as ``.grad``); returns ``self``."""
        self._inplace_check()
        self._value[...] = 0
        self._bump()
        return self

    def fill_(self, value):
        """Fill with ``value`` in place; returns ``self``."""
        self._inplace_check()
        self._value[...] = value.item() if isinstance(value, Tensor) else value
        self._bump()
        return self

    def copy_(self, src):
        """Copy ``src`` (broadcast to this shape) into this tensor in place; returns ``self``."""
        self._inplace_check()
        v = src._peek() if isinstance(src, Tensor) else np.asarray(src)
        try:
            self._value[...] = np.broadcast_to(v, self.shape)
        except ValueError:
            raise ValueError(
                f"copy_: cannot copy a tensor of shape {np.shape(v)} into shape {tuple(self.shape)}"
            ) from None
        self._bump()
        return self

    def _inplace_check(self):
        if self._tape is not None:
            raise RuntimeError(
                "in-place operations are not supported on tensors computed in a graph"
            )
        if self._copied:
            raise RuntimeError(
                "in-place write to a strided slice, transpose or expansion of a tensor: in tape "
                "these are copies, not views, so the write would not reach the original. Write "
                "into the original instead, e.g. `x[:, 0] = 2.0` under no_grad"
            )
        if self._rg and is_grad_enabled():
            raise RuntimeError(
                "a leaf tensor that requires grad is being used in an in-place operation; "
                "wrap the update in `with tape.no_grad():`"
            )

    def __setitem__(self, key, value):
        """``x[key] = value`` with NumPy's indexing.

        On a tensor that owns its value (a leaf: under ``no_grad`` if it requires grad) the
        write happens in place and bumps the version. On a tensor computed in a graph (or
        inside :func:`tape.record`) it is recorded as a functional update,
        ``x.at[key].set(value)``, and ``x`` is rebound to the result: gradients flow to
        ``value`` and to the elements of ``x`` not overwritten, and ops recorded before the
        write keep the old value, as their backward needs. Tensors sharing the old memory
        (views made by reshape or contiguous slicing, or the base of a view written to) would
        see the write in PyTorch; tape refuses to use them afterwards (a clear error), so they
        never silently keep the old value."""
        if self._tape is not None:
            return self._setitem_traced(key, value)
        self._inplace_check()
        if isinstance(key, Tensor):
            key = key._peek()
        elif isinstance(key, tuple):
            key = tuple(k._peek() if isinstance(k, Tensor) else k for k in key)
        v = value._peek() if isinstance(value, Tensor) else value
        self._check_cast(v)
        try:
            self._value[key] = v
        except (IndexError, ValueError) as e:
            raise type(e)(f"setitem on a tensor of shape {tuple(self.shape)}: {e}") from None
        self._bump()

    def _check_cast(self, v):
        if not np.can_cast(np.result_type(v), self.dtype, "same_kind"):
            raise RuntimeError(
                f"setitem: a value of dtype {np.result_type(v)} can't be cast to the tensor's dtype {self.dtype}"
            )

    def _setitem_traced(self, key, value):
        if self._op is None and self._rg and is_grad_enabled():
            raise RuntimeError(
                "a leaf tensor that requires grad is being used in an in-place operation "
                "(x[...] = v on a differentiated argument of tape.record); write into a copy: "
                "y = x.clone(); y[...] = v"
            )
        if self._copied:
            raise RuntimeError(
                "in-place write to a strided slice, transpose or expansion of a tensor: in tape "
                "these are copies, not views, so the write would not reach the original. Write "
                "into the original instead (x[:, 0] = v), or clone() the slice first"
            )
        from tape.frontend.ops.scatter import at

        self._check_cast(value._peek() if isinstance(value, Tensor) else value)
        new = at(self)[key].set(value)
        if new.dtype != self.dtype:
            new = new.to(self.dtype)
        tp, b = self._resolve()  # after the update: merging graphs may have moved it
        root = int(tp.bufs[b, B_ALIAS])
        tp._written.add(b if root < 0 else root)
        self._tape, self._buf = new._resolve()
        self._op, self._rg = "setitem", new._rg

    def _inplace(self, other, fn):
        self._inplace_check()
        other = other._peek() if isinstance(other, Tensor) else other
        fn(self._value, other, out=self._value, casting="same_kind")
        self._bump()
        return self

    def __iadd__(self, other):
        if self._tape is not None:
            return NotImplemented
        return self._inplace(other, np.add)

    def __isub__(self, other):
        if self._tape is not None:
            return NotImplemented
        return self._inplace(other, np.subtract)

    def __imul__(self, other):
        if self._tape is not None:
            return NotImplemented
        return self._inplace(other, np.multiply)

    def __itruediv__(self, other):
        if self._tape is not None:
            return NotImplemented
        return self._inplace(other, np.divide)

    def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False):
        """A copy converted to ``dtype`` (differentiable between float dtypes), as PyTorch's
        ``to``: ``x.to(dtype)``, ``x.to(device)``, ``x.to(device, dtype)``, ``x.to(other)``
        (other's dtype), with ``dtype=`` / ``device=`` keywords. Only the CPU is a device for
        eager tensors (``"cuda"`` raises, pointing to ``Tape.to("cuda")``)."""
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif isinstance(a, (str, _device_cls)):
                device = a
            elif a is not None:
                dtype = a
        check_device(device, "to")
        if dtype is None:
            return self.clone() if copy else self
        dtype = _check_dtype(dtype)
        if dtype == self.dtype:
            return self.clone() if copy else self
        if (
            dtype.kind == "f"
            and self.dtype.kind == "f"
            and ((self._rg and is_grad_enabled()) or self._tape is not None)
        ):
            return self._copy_entry(dtype)
        return Tensor(self.numpy().astype(dtype))

    @property
    def device(self):
        """Always ``device(type='cpu')``: eager tensors live on the CPU."""
        return CPU

    is_cuda = False

    def cpu(self):
        return self

    def cuda(self, device=None):
        raise RuntimeError(f"cuda(): {CUDA_EAGER}")

    def clone(self):
        """A copy with its own memory; differentiable (its gradient flows back to ``self``)."""
        if self._tape is None and not (self._rg and is_grad_enabled()):
            return Tensor(self._value.copy())
        return self._copy_entry(self.dtype)

    def _copy_entry(self, dtype):
        """A recorded, differentiable copy of this tensor as ``dtype`` (one COPY entry)."""
        st = c_strides(self.shape)
        return apply(COPY, [self], self.shape, copy_block(self.shape, 0, st, 0, st), dtype=dtype)

    astype = to

    def double(self):
        return self.to(float64)

    def long(self):
        return self.to(int64)

    def int(self):
        return self.to(int32)

    def bool(self):
        return self.to(bool_)

    def is_contiguous(self, memory_format=None):
        return True  # every tensor is C-contiguous (views that are not are copies)

    def float(self):
        return self.to(float32)

    # ------------------------------------------------------------ autograd

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        """Accumulate d(self)/d(leaf) into ``.grad`` of every leaf that requires grad.

        ``gradient`` is the adjoint of ``self`` (needed unless ``self`` has one element).
        As in PyTorch, a second backward through any part of the same graph raises unless the
        first passed ``retain_graph=True`` (then it accumulates again). With
        ``create_graph=True`` the gradients are differentiable once more (see
        :func:`tape.autograd.grad`).
        """
        if create_graph:  # gradients that are differentiable once more
            from tape.frontend.autograd import backward_create_graph

            return backward_create_graph(self, gradient)
        if not self._rg:
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn"
            )
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; this tensor has shape "
                    f"{tuple(self.shape)}: pass backward(gradient=...) with that shape"
                )
            seed = _ONE
        else:
            seed = np.asarray(
                gradient._peek() if isinstance(gradient, Tensor) else gradient, np.float64
            )
            if seed.shape != self.shape:
                raise RuntimeError(
                    f"backward: gradient has shape {tuple(seed.shape)}, the tensor has shape {tuple(self.shape)}"
                )
        if self._tape is None:
            if self._base is not None:  # a view of a leaf: route through one entry
                return (self * 1.0).backward(seed.reshape(self.shape))
            self._accumulate(seed.reshape(self.shape))
            return
        tp, b = self._resolve()
        if tp.recording:
            raise RuntimeError(
                "backward() inside tape.record(): record the function, then call backward() or "
                "gradient() on the returned Tape"
            )
        if tp._written:
            stale(tp, [b])
        roots = np.array([b], np.int64)
        if tp._freed is not None and tp.reaches_freed(roots):
            raise RuntimeError(
                "Trying to backward through the graph a second time (or directly access saved "
                "tensors after they have already been freed). Specify retain_graph=True if you "
                "need to backward through the graph a second time or if you need to access "
                "saved tensors after calling backward."
            )
        tp.closed = True  # leaves start their next expression on a fresh tape
        need = tp.run_backward(roots, seed, zero_leaves=True)
        if not retain_graph:
            tp.mark_freed(need)
        bufs, grad = tp.bufs, tp.grad
        for r in list(_RETAINED.values()) if _RETAINED else ():  # retain_grad(): non-leaves
            t = r()
            if t is None:
                continue
            rtp, rb = t._resolve()
            if rtp is tp and need[rb]:
                off = bufs.item(rb, B_OFF)
                g = grad[off : off + bufs.item(rb, B_SIZE)].reshape(t.shape)
                if t._grad is None:
                    t._grad = Tensor(g.astype(t.dtype))
                else:
                    t._grad._value += g
        for leaf, lb in tp.leaves:
            if leaf._rg and leaf._op is None and need[lb] and bufs.item(lb, B_KIND) == LEAF:
                off = bufs.item(lb, B_OFF)
                g = grad[off : off + bufs.item(lb, B_SIZE)]
                if leaf._grad is None:  # a new tensor owning a copy, in the leaf's dtype
                    leaf._grad = Tensor(g.astype(leaf.dtype).reshape(leaf.shape))
                else:
                    leaf._grad._value += g.reshape(leaf.shape)

    def _accumulate(self, g):
        if self._grad is None:
            self._grad = Tensor(np.array(g, dtype=self.dtype))
        else:
            self._grad._value += g

    # ------------------------------------------------------------ display

    def __repr__(self):
        from tape.program.persist import tensor_repr

        return tensor_repr(self)

    __str__ = __repr__


# ---------------------------------------------------------------- recording


def as_tensor(x, dtype=None) -> Tensor:
    """``x`` if it is a Tensor, else a constant tensor of its value."""
    if isinstance(x, Tensor):
        return x
    return tensor(x, dtype=dtype)


def _value_of(x):
    return x._arena_value() if isinstance(x, Tensor) else x


def _float_dtype(ts):
    best = None
    for t in ts:
        if isinstance(t, Tensor) and t.dtype.kind == "f":
            if best is None or t.dtype.itemsize > best.itemsize:
                best = t.dtype
    return best


def result_dtype(ts, rule="promote"):
    """The dtype of an op's result on inputs ``ts`` under the op's dtype rule
    (:attr:`tape.registry.Op.dtype`). ``"promote"``, as PyTorch: the widest float tensor;
    Python floats do not widen a float32 tensor; integers and bools give int64. ``"float"``:
    the same, but integers give float64 (true division). ``"bool"``: bool.
    ``("like", positions)``: promote over the inputs at ``positions``."""
    if rule == "bool":
        return bool_
    if rule.__class__ is tuple:
        ts = [ts[k] for k in rule[1]]
    best = None
    pyfloat = False
    for t in ts:
        if t.__class__ is Tensor:
            d = t.dtype
            if d.kind == "f" and (best is None or d.itemsize > best.itemsize):
                best = d
        elif t.__class__ is float or isinstance(t, np.floating):
            pyfloat = True
    if best is not None:
        return best
    if rule == "float" or pyfloat:
        return _DEFAULT_FLOAT[0]
    return int64


def _buffer_in(target: Tape, x, grad_on):
    """The buffer of ``x`` in ``target``, copying a leaf or constant in on first use."""
    if x.__class__ is Tensor or isinstance(x, Tensor):
        tp = x._tape
        if tp is not None:
            if tp._merged is not None:
                tp = x._resolve()[0]
            if tp is target:
                if target._written:
                    stale(target, [x._buf])
                return x._buf
        key = id(x)
        b, ver = _copied(target, x, key)
        if b is None and tp is None and x._base is None and target.lift is None:
            # a leaf or constant owning its value: the common case
            b = target.copy_in(
                x, LEAF if (x._rg and grad_on and not target.recording) else CONST, ver
            )
        elif b is None and x._base is not None:
            leaf, off = x._base
            b = target.alias(_buffer_in(target, leaf, grad_on), x.shape, off)
            target.leaf_bufs[key] = b
            target.leaf_vers[key] = ver
            target.leaves.append((x, b))  # keeps x alive; not a leaf, so it gets no .grad
        elif b is None and target.lift is not None and target.recording and target.lift.wants(x):
            b = target.lift.add(target, x, x._arena_value())  # a checkpoint's closure tensor
        elif b is None:
            kind = (
                LEAF if (x._rg and grad_on and not target.recording and x._tape is None) else CONST
            )
            b = target.new_buffer(x.shape, kind, x._arena_value())
            target.leaf_bufs[key] = b
            target.leaf_vers[key] = ver
            target.leaves.append((x, b))  # keeps x alive, so its id stays unique
        return b
    if isinstance(x, (float, int)):
        return target.constant(x)
    v = np.asarray(x)
    return target.new_buffer(v.shape, CONST, v)


def _copied(tp, x, key):
    """``(buffer, version)``: the buffer tape ``tp`` copied tensor ``x`` (``id(x)`` is
    ``key``) into, or ``None`` if it has none or ``x`` was written in place since, and ``x``'s
    version now."""
    b = tp.leaf_bufs.get(key)
    ver = x._ver[0] if x._ver is not None else 0
    if b is not None and tp.leaf_vers.get(key, 0) != ver:
        b = None  # written in place since this tape copied it: copy the new value
    return b, ver


def stale(tp, bufs):
    """Raise if one of ``bufs`` shares memory with a tensor rebound by ``x[key] = v``
    (:meth:`Tensor.__setitem__`): in PyTorch it would see the write, here it holds the value
    from before it."""
    for b in bufs:
        root = int(tp.bufs[b, B_ALIAS])
        if (b if root < 0 else root) in tp._written:
            raise RuntimeError(
                "this tensor shares memory with a tensor written in place (x[...] = v) after "
                "it was made: a view (reshape, contiguous slice) of the written tensor, or the "
                "base of a written view. PyTorch would show the write through it; tape records "
                "writes as new values, so it would hold the value from before. Use the written "
                "tensor itself, or clone() before writing"
            )


def tapes_of(args):
    """``(recording, eager_tapes)`` of the tensors among ``args``: the recording they belong
    to (None if none; two different ones raise) and the open eager tapes. :func:`apply`
    runs the same loop inline (its hot path)."""
    rec = None
    eager = []
    for a in args:
        if a.__class__ is Tensor and a._tape is not None:
            tp = a._resolve()[0]
            if tp.recording:
                rec = tp if rec is None or rec is tp else _deeper(rec, tp)
            else:
                eager.append(tp)
    return rec, eager


def apply(op, inputs, shape, ints=None, *, dtype=None, parts=None) -> Tensor:
    """Record ``op`` (a :class:`tape.registry.Op`, or its name) on ``inputs`` (Tensors, NumPy
    arrays or numbers) with output ``shape`` and attribute block ``ints``; returns the output
    tensor, of ``dtype`` (default: by the op's dtype rule).

    ``parts`` (for ops that write regions of one output, such as concatenation) is a list of
    ``(input_positions, ints)``: one entry each, all writing the same output buffer.

    This is every op's hot path in eager mode (a few microseconds each): it reads each input
    once, and the common cases (inputs on one eager tape, leaves, Python floats) take no
    detour.
    """
    if op.__class__ is str:
        op = _BY_NAME[op]
    diff = op.differentiable
    if parts is not None:
        diff = diff * len(inputs)
    grad_on = _state.grad
    rec = None
    need = False
    target = None  # the eager tape of the inputs that have one
    many = False  # inputs on two or more eager tapes: _union merges them
    best = None  # the widest float dtype among the tensors (result_dtype's "promote")
    for t, d in zip(inputs, diff):
        if t.__class__ is not Tensor:
            continue
        dt = t.dtype
        if dt.kind == "f" and (best is None or dt.itemsize > best.itemsize):
            best = dt
        tp = t._tape
        if tp is not None:
            if tp._merged is not None:
                tp = t._resolve()[0]
            if tp.recording:
                rec = tp if rec is None or rec is tp else _deeper(rec, tp)
            elif target is None:
                target = tp
            elif tp is not target:
                many = True
        if d and t._rg and grad_on:
            need = True
    if dtype is None:
        rule = op.dtype
        if best is not None and (rule == "promote" or rule == "float"):
            dtype = best
        else:
            dtype = result_dtype(inputs, rule)
    if rec is None and not need:
        return _compute_constant(op, inputs, shape, ints, parts, dtype, best)
    if rec is not None:
        target = rec
    elif many:
        target = _union(tapes_of(inputs)[1], inputs)
    elif target is None:
        target = _fresh(inputs, best or float64)
    if dtype.kind == "f" and dtype.itemsize > target.dtype.itemsize:
        target.promote(dtype)
    ins = [
        t._buf
        if (t.__class__ is Tensor and t._tape is target)
        else target.constant(t)
        if t.__class__ is float
        else _buffer_in(target, t, grad_on)
        for t in inputs
    ]
    if target._written:
        stale(target, ins)
    if rec is None:
        # eager: an input that requires grad has a LEAF or ACTIVE buffer (a leaf copied in as
        # a constant is copied again once it requires grad: requires_grad_ bumps its version)
        active = need
    else:
        active = False
        if grad_on:
            bufs = target.bufs
            for b, d in zip(ins, diff):
                if d and bufs.item(b, B_KIND) != CONST:
                    active = True
                    break
    first = target.n_entries
    if parts is None:
        out = target.emit(op.code, ins, shape, ACTIVE if active else CONST, ints)
    else:
        out = target.new_buffer(shape, ACTIVE if active else CONST)
        for pos, pints in parts:
            target.add_entry(op.code, [ins[k] for k in pos], out, pints)
        target.run_forward(first, target.n_entries)
    if target.recording or (_anomaly.ON and _anomaly.enabled()):
        src = user_line()
        for i in range(first, target.n_entries):
            target.sources[i] = src
        if _anomaly.enabled():
            _anomaly.check_entries(target, target.data, first, target.n_entries)
    return Tensor._traced(target, out, shape, dtype, active, op.name)


_BY_NAME = registry.BY_NAME


REUSE_LIMIT = 4096
REUSE_IPOOL = 4096  # a new eager tape starts with the previous one's int blocks up to this size
EAGER_ARENA = 1 << 20  # the most elements a fresh eager tape reserves for its inputs' sake
EAGER_ARENA_REUSE = 1 << 24  # ... and to match the previous eager tape's size


def _union(tapes, inputs) -> Tape:
    """One eager tape holding every input's graph: the largest, with the others merged in
    (:func:`_fresh` when no input has a graph)."""
    uniq = []
    for tp in tapes:
        if all(tp is not u for u in uniq):
            uniq.append(tp)
    if not uniq:
        return _fresh(inputs, _float_dtype(inputs) or float64)
    if len(uniq) == 1:
        return uniq[0]
    uniq.sort(key=lambda t: -t.n_data)
    target = uniq[0]
    for other in uniq[1:]:
        target.merge(other)
    return target


def _fresh(inputs, want) -> Tape:
    """The eager tape for an expression starting from leaves and constants (no input has a
    graph), of arena dtype ``want``.

    The tape a leaf was last copied into is reused while it is open (no ``backward`` yet,
    under ``REUSE_LIMIT`` entries), so ``f(x[1:], x[:-1])`` builds one graph instead of
    merging two; failing that, the thread's newest open eager tape, so ``a + b * x + c * x **
    2`` grows one tape instead of merging three; failing that, a new tape.
    """
    leaves = []
    for t in inputs:
        if t.__class__ is Tensor and t._rg:
            leaf = t._base[0] if t._base is not None else t
            ref = leaf._last
            if ref is not None:
                tp = ref()
                if (
                    tp is not None
                    and not tp.closed
                    and tp._merged is None
                    and tp.n_entries < REUSE_LIMIT
                ):
                    return tp
            leaves.append(leaf)
    ref = _state.open
    tp = ref() if ref is not None else None
    if (
        tp is None
        or tp.closed
        or tp._merged is not None
        or tp.n_entries >= REUSE_LIMIT
        or tp.dtype != want  # a float32 expression keeps a float32 arena
    ):
        # room for a few values of the inputs' size, or for as much as the thread's
        # previous eager tape used (a training loop builds the same graph every step):
        # then the arena need not grow (each growth copies it)
        n = 0
        for t in inputs:
            if t.__class__ is Tensor:
                n += t.numel()
        cap = min(16 * n, EAGER_ARENA)
        prev = tp if tp is not None and tp._merged is None else None
        if prev is not None:
            cap = max(cap, min(prev.n_data, EAGER_ARENA_REUSE))
        tp = Tape(want, cap)
        if prev is not None and prev.n_ipool <= REUSE_IPOOL:
            tp.share_ints(prev)  # the same shapes and attribute blocks, without interning them
        ref = _state.open = weakref.ref(tp)
    for leaf in leaves:
        leaf._last = ref
    return tp


def _scratch(dtype) -> Tape:
    cache = _state.scratch
    if cache is None:
        cache = _state.scratch = {}
    tp = cache.get(dtype.str)
    if tp is None or tp.n_data > 1 << 20:
        tp = cache[dtype.str] = Tape(dtype)
    tp.n_entries = tp.n_bufs = tp.n_ipool = tp.n_data = 0
    tp.shapes = []
    tp._interned = {}
    tp._consts = {}
    return tp


def _compute_constant(op, inputs, shape, ints, parts, dtype, best):
    """Run one op on values that need no gradient, on a scratch tape; the result owns its value.
    Ops whose NumPy reference gives the kernel's bits (``Op.exact_ref``) use it instead, on
    float data, without a compiled call. ``best``: the widest float dtype of the inputs."""
    arena = float32 if (best == float32 and dtype == float32) else float64
    if op.exact_ref and parts is None:
        vals = []
        for x in inputs:
            v = x._value if x.__class__ is Tensor and x._tape is None else _value_of(x)
            if v.__class__ is np.ndarray:
                if v.dtype != arena:
                    if v.dtype.kind != "f":
                        break
                    v = v.astype(arena)
            elif v.__class__ is float or v.__class__ is int:
                v = arena.type(v)
            else:
                break
            vals.append(v)
        else:
            token = _quiet()
            try:
                r = op.ref(*vals)
            finally:
                _loud(token)
            if r.__class__ is not np.ndarray or r.dtype != dtype or r.shape != shape:
                r = np.asarray(r, dtype).reshape(shape)
            return Tensor(r)
    tp = _scratch(arena)
    ins = []
    for x in inputs:
        v = np.asarray(_value_of(x))
        ins.append(tp.new_buffer(v.shape, CONST, v))
    out = tp.new_buffer(shape, CONST)
    if parts is None:
        tp.add_entry(op.code, ins, out, ints)
    else:
        for pos, pints in parts:
            tp.add_entry(op.code, [ins[k] for k in pos], out, pints)
    tp.run_forward(0, tp.n_entries)
    res = Tensor(tp.value(out).astype(dtype, copy=True))
    if op is COPY and parts is None:
        res._copied = True  # a strided slice, transpose or expansion (see _inplace_check)
    return res


def view(x, shape, offset=0) -> Tensor:
    """``shape``-shaped view of ``x``'s memory from element ``offset`` on: no copy, no entry.
    Used by reshape, squeeze, unsqueeze, flatten and contiguous slices."""
    shape = tuple(int(s) for s in shape)
    if shape == x.shape and offset == 0:
        return x
    tp = x._tape
    if tp is None:
        flat = x._value.reshape(-1)
        out = Tensor(flat[offset : offset + math.prod(shape)].reshape(shape), _ver=x._ver)
        if x._rg and is_grad_enabled():
            # A view of a leaf joins a tape only when an op uses it (then as an alias of the
            # leaf's buffer there), so slicing a parameter starts no graph of its own.
            leaf, base = x._base if x._base is not None else (x, 0)
            out._base = (leaf, base + offset)
            out._rg = True
            out._op = "view"
        return out
    if tp._merged is not None:
        tp = x._resolve()[0]
    b = _buffer_in(tp, x, is_grad_enabled())
    nb = tp.alias(b, shape, offset)
    return Tensor._traced(tp, nb, shape, x.dtype, tp.bufs[nb, B_KIND] != CONST, "view")


def reshape(x, *shape) -> Tensor:
    """Same data, new shape (one dimension may be ``-1``). Free: an alias, not a copy."""
    x = as_tensor(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    n = x.numel()
    if shape.count(-1) > 1:
        raise ValueError("reshape: only one dimension can be -1")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or n % rest:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} into {shape}"
            )
        shape = tuple(n // rest if s == -1 else s for s in shape)
    if math.prod(shape) != n or any(s < 0 for s in shape):
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} ({n} elements) into {shape}"
        )
    return view(x, shape, 0)


def flatten(x, start_dim=0, end_dim=-1) -> Tensor:
    """Axes ``start_dim`` to ``end_dim`` (both included; negative ones count from the end)
    merged into one, as PyTorch's ``flatten``: by default a 1-D view of all elements."""
    x = as_tensor(x)
    nd = max(x.ndim, 1)
    a, b = operator.index(start_dim), operator.index(end_dim)
    if not (-nd <= a < nd and -nd <= b < nd):
        raise IndexError(
            f"flatten: start_dim {start_dim} or end_dim {end_dim} is out of range for a "
            f"{x.ndim}-D tensor"
        )
    a, b = a % nd, b % nd
    if a > b:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    if x.ndim == 0:
        return view(x, (1,), 0)
    shape = tuple(x.shape)
    return view(x, shape[:a] + (math.prod(shape[a : b + 1]),) + shape[b + 1 :], 0)


def squeeze(x, axis=None, *, dim=None) -> Tensor:
    """Drop axes of length one (all of them, or ``axis`` / ``dim``: an int or a tuple)."""
    if dim is not None:
        if axis is not None:
            raise TypeError("squeeze: pass axis or dim, not both")
        axis = dim
    x = as_tensor(x)
    if axis is None:
        return view(x, tuple(s for s in x.shape if s != 1), 0)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = {a % x.ndim for a in axes} if x.ndim else set()
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(
                f"squeeze: axis {a} of shape {tuple(x.shape)} has length {x.shape[a]}, not 1"
            )
    return view(x, tuple(s for k, s in enumerate(x.shape) if k not in axes), 0)


def unsqueeze(x, axis=None, *, dim=None) -> Tensor:
    """Insert an axis of length one at ``axis`` (PyTorch: ``dim``)."""
    if (axis is None) == (dim is None):
        raise TypeError("unsqueeze: pass the new axis once, as axis or dim")
    axis = dim if axis is None else axis
    x = as_tensor(x)
    nd = x.ndim + 1
    if not -nd <= axis < nd:
        raise ValueError(f"unsqueeze: axis {axis} is out of range for the {nd}-D result")
    axis %= nd
    return view(x, x.shape[:axis] + (1,) + x.shape[axis:], 0)


expand_dims = unsqueeze


# ---------------------------------------------------------------- elementwise front end

_bcast_cache: dict = {}


def _shape_of(x):
    if isinstance(x, Tensor):
        return x.shape
    if isinstance(x, (float, int)):
        return ()
    return np.shape(x)


def elementwise(op, *args) -> Tensor:
    """Record elementwise ``op`` (a :class:`tape.registry.Op`, or its name) on ``args`` with
    NumPy broadcasting."""
    if op.__class__ is str:
        op = _BY_NAME[op]
    if len(args) == 1:
        a = args[0]
        if a.__class__ is Tensor and a._rg:
            tp = _direct_tape(a, op)
            if tp is not None:  # apply's eager case for one input, without its loops
                out = tp.emit(op.code, (a._buf,), a.shape, ACTIVE, None)
                return Tensor._traced(tp, out, a.shape, a.dtype, True, op.name)
    shapes = tuple(
        [
            a.shape if a.__class__ is Tensor else () if a.__class__ in _NUMBER else _shape_of(a)
            for a in args
        ]  # fmt: skip
    )
    key = (op.code, shapes)
    hit = _bcast_cache.get(key)
    if hit is None:
        # plain tuples: the message of shapes that do not broadcast prints them as such
        out_shape, ints = broadcast.encode(op.name, tuple(tuple(s) for s in shapes))
        hit = _bcast_cache[key] = (out_shape, None if ints is None else tuple(ints))
    out_shape, ints = hit
    args = [a if a.__class__ in _PLAIN else _const(a) for a in args]
    return apply(op, args, out_shape, ints)


def _direct_tape(t, op):
    """The eager tape of tensor ``t`` when ``op`` (an elementwise op whose inputs are all
    differentiable, of the ``promote`` dtype rule) on it records directly, without
    :func:`apply`'s general path: an open eager tape (not a recording, not merged into
    another, no tensor rebound by ``x[key] = v``) in ``t``'s dtype, with gradients on and
    anomaly mode off. ``None`` otherwise."""
    tp = t._tape
    if (
        tp is not None
        and tp._merged is None
        and not tp.recording
        and not tp._written
        and op.dtype == "promote"
        and t.dtype == tp.dtype
        and _state.grad
        and not _anomaly.ON
        and all(op.differentiable)
    ):
        return tp
    return None


def _direct_in(tp, x):
    """The buffer of tensor ``x`` in ``tp`` (an open eager tape, see :func:`_direct_tape`) on
    the direct paths: ``x``'s own if it is on ``tp``; a leaf or constant owning its value in
    ``tp``'s dtype is copied in on first use (as :func:`_buffer_in` does). ``None`` for
    anything else (views, other tapes, other dtypes), which :func:`apply` handles."""
    tx = x._tape
    if tx is tp:
        return x._buf
    if tx is not None or x._base is not None or x.dtype != tp.dtype:
        return None
    b, ver = _copied(tp, x, id(x))
    if b is None:
        b = tp.copy_in(x, LEAF if x._rg else CONST, ver)
    return b


def _fresh_direct(a, b, op):
    """:func:`_direct_tape` for two tensors with no graph yet (leaves and constants): the
    eager tape :func:`_fresh` picks for them, when the direct path's conditions hold."""
    dt = a.dtype
    if (
        b.dtype == dt
        and dt.kind == "f"
        and op.dtype == "promote"
        and _state.grad
        and not _anomaly.ON
        and all(op.differentiable)
    ):
        tp = _fresh((a, b), dt)
        if tp.dtype == dt and not tp._written and tp._merged is None:
            return tp
    return None


def binary(op, a, b) -> Tensor:
    """:func:`elementwise` for two arguments: the operators' path (``a * b``), which skips
    building argument lists when both are tensors or one is a Python float."""
    ca, cb = a.__class__, b.__class__
    if ca is Tensor:
        sa = a.shape
        if cb is Tensor:
            key = (op.code, (sa, b.shape))
        elif cb is float:
            key = (op.code, (sa, ()))
        else:
            return elementwise(op, a, b)
    elif ca is float and cb is Tensor:
        key = (op.code, ((), b.shape))
    else:
        return elementwise(op, a, b)
    hit = _bcast_cache.get(key)
    if hit is None:
        return elementwise(op, a, b)
    if op.exact_ref:
        # no graph and no gradient (an optimiser's update, a constant expression): NumPy's
        # result, which has the kernel's bits, without the recording path
        grad_on = _state.grad
        if (ca is float or (a._tape is None and not (a._rg and grad_on))) and (
            cb is float or (b._tape is None and not (b._rg and grad_on))
        ):
            best = _float_dtype((a, b))
            if best is not None and op.dtype in ("promote", "float"):
                return _compute_constant(op, (a, b), hit[0], hit[1], None, best, best)
    # apply's most common eager cases, without its loops: one input requiring grad, the
    # inputs on one open eager tape or leaves and constants copied into it (or one of them a
    # Python float), all in the tape's dtype
    if ca is cb:
        if a._rg or b._rg:
            if a._tape is None and b._tape is None:
                tp = _fresh_direct(a, b, op)
            else:
                tp = _direct_tape(a if a._tape is not None else b, op)
            if tp is not None:
                ia = _direct_in(tp, a)
                ib = _direct_in(tp, b) if ia is not None else None
                if ib is not None:
                    out = tp.emit(op.code, (ia, ib), hit[0], ACTIVE, hit[1])
                    return Tensor._traced(tp, out, hit[0], tp.dtype, True, op.name)
        return apply(op, (a, b), hit[0], hit[1])
    t = a if ca is Tensor else b
    tp = _direct_tape(t, op)
    if tp is not None:
        if t._rg:
            ins = (a._buf, tp.constant(b)) if ca is Tensor else (tp.constant(a), b._buf)
            out = tp.emit(op.code, ins, hit[0], ACTIVE, hit[1])
            return Tensor._traced(tp, out, hit[0], t.dtype, True, op.name)
    return apply(op, (a, b), hit[0], hit[1])


_PLAIN = (Tensor, float, int)  # arguments _const passes through as they are
_NUMBER = (float, int)


def _const(a):
    if isinstance(a, (Tensor, float, int)) and not isinstance(a, bool):
        return a
    if isinstance(a, (bool, np.bool_)):
        return float(a)
    try:
        v = np.asarray(a)
    except Exception:  # noqa: BLE001
        raise TypeError(
            f"expected a tensor, an array or a number, got {type(a).__name__}"
        ) from None
    _check_dtype(v.dtype)
    return tensor(v)


# ---------------------------------------------------------------- constructors


def _float_default(v, dtype):
    """``v`` in the default float dtype when it came from Python floats (no dtype given)."""
    if dtype is None and v.dtype == float64 and _DEFAULT_FLOAT[0] != float64:
        return v.astype(_DEFAULT_FLOAT[0])
    return v


def tensor(data, requires_grad=False, dtype=None, *, device=None) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (nested lists, NumPy arrays, numbers).

    Python floats give the default dtype (float64 unless :func:`set_default_dtype` changed it;
    PyTorch's is float32, tape's float64, which finite-difference checks need), ints int64,
    bools bool; NumPy arrays keep their dtype. Pass ``dtype=tape.float32`` for single
    precision. ``device`` may only be the CPU.
    """
    check_device(device, "tensor")
    src = data
    if isinstance(data, Tensor):
        data = data.numpy()
    try:
        v = np.array(data, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise TypeError(f"tensor: could not convert data to a numeric array ({e})") from None
    dt = _check_dtype(v.dtype)
    if v.dtype != dt:
        v = v.astype(dt)
    if not isinstance(src, (np.ndarray, np.generic, Tensor)):
        v = _float_default(v, dtype)
    return Tensor(v, requires_grad=requires_grad)


def _shape_args(shape, what="shape"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(
            f"{what}: the size must be ints or a tuple of ints, got {shape!r}"
        ) from None
    if any(s < 0 for s in out):
        raise ValueError(f"{what}: negative dimension in size {out}")
    return out


def _dtype_or_default(dtype):
    return _DEFAULT_FLOAT[0] if dtype is None else _check_dtype(dtype)


def zeros(*shape, dtype=None, device=None, requires_grad=False, size=None) -> Tensor:
    """A tensor of zeros (the default float dtype unless ``dtype``). ``size=``: the shape,
    as PyTorch's keyword."""
    shape = _size_keyword(shape, size, "zeros")
    check_device(device, "zeros")
    return Tensor(np.zeros(_shape_args(shape, "zeros"), _dtype_or_default(dtype)), requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False, size=None) -> Tensor:
    """A tensor of ones (the default float dtype unless ``dtype``). ``size=``: the shape,
    as PyTorch's keyword."""
    shape = _size_keyword(shape, size, "ones")
    check_device(device, "ones")
    return Tensor(np.ones(_shape_args(shape, "ones"), _dtype_or_default(dtype)), requires_grad)


def empty(*shape, dtype=None, device=None, requires_grad=False, size=None) -> Tensor:
    """A tensor to be overwritten (PyTorch's ``empty``). Its memory is zeroed, never garbage. ``size=``: the shape,
    as PyTorch's keyword."""
    shape = _size_keyword(shape, size, "empty")
    check_device(device, "empty")
    return Tensor(np.zeros(_shape_args(shape, "empty"), _dtype_or_default(dtype)), requires_grad)


def full(shape=None, fill_value=None, dtype=None, requires_grad=False, *, device=None, size=None):
    """A tensor of ``shape`` (PyTorch: ``size=``) filled with ``fill_value`` (its dtype
    follows the value)."""
    (shape,) = _size_keyword((shape,) if shape is not None else (), size, "full") or (None,)
    if shape is None or fill_value is None:
        raise TypeError("full() needs a shape (or size=) and a fill_value")
    check_device(device, "full")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    v = np.full(shape, fill_value, dtype=dtype)
    if isinstance(fill_value, float):
        v = _float_default(v, dtype)
    return tensor(v, requires_grad, None)


def _size_keyword(shape, size, what):
    """The positional ``shape`` arguments, or PyTorch's ``size=`` keyword in their place."""
    if size is None:
        return shape
    if shape:
        raise TypeError(f"{what}() got the shape twice: positionally and as size=")
    return (size,)


def _like(x, dtype):
    return _check_dtype(dtype) if dtype is not None else as_tensor(x).dtype


def _input(x, input, what):
    """The tensor argument of a ``*_like`` function: positional, or PyTorch's ``input=``."""
    if input is None:
        if x is None:
            raise TypeError(f"{what}() missing its tensor argument (input)")
        return x
    if x is not None:
        raise TypeError(f"{what}() got the tensor twice: positionally and as input=")
    return input


def zeros_like(x=None, dtype=None, requires_grad=False, *, device=None, input=None) -> Tensor:
    """A tensor of zeros with the shape of ``x``, as ``torch.zeros_like``.

    Parameters
    ----------
    x : Tensor or array_like
        Whose shape (and, without ``dtype``, floating dtype) the result takes; ``input=`` is
        PyTorch's name for it.
    dtype : dtype, optional
        The result's dtype.
    requires_grad : bool
        Whether the result is a leaf that requires grad.
    device : optional
        Only ``"cpu"`` for eager tensors.

    Returns
    -------
    Tensor
    """
    x = _input(x, input, "zeros_like")
    return zeros(_shape_of(x), dtype=_like(x, dtype), device=device, requires_grad=requires_grad)


def ones_like(x=None, dtype=None, requires_grad=False, *, device=None, input=None) -> Tensor:
    """A tensor of ones with the shape of ``x``, as ``torch.ones_like``.

    Parameters
    ----------
    x : Tensor or array_like
        Whose shape (and, without ``dtype``, floating dtype) the result takes; ``input=`` is
        PyTorch's name for it.
    dtype : dtype, optional
        The result's dtype.
    requires_grad : bool
        Whether the result is a leaf that requires grad.
    device : optional
        Only ``"cpu"`` for eager tensors.

    Returns
    -------
    Tensor
    """
    x = _input(x, input, "ones_like")
    return ones(_shape_of(x), dtype=_like(x, dtype), device=device, requires_grad=requires_grad)


def empty_like(x=None, dtype=None, requires_grad=False, *, device=None, input=None) -> Tensor:
    """A tensor of the shape of ``x`` with uninitialised values, as ``torch.empty_like``.

    Parameters
    ----------
    x : Tensor or array_like
        Whose shape (and, without ``dtype``, floating dtype) the result takes; ``input=`` is
        PyTorch's name for it.
    dtype : dtype, optional
        The result's dtype.
    requires_grad : bool
        Whether the result is a leaf that requires grad.
    device : optional
        Only ``"cpu"`` for eager tensors.

    Returns
    -------
    Tensor
    """
    x = _input(x, input, "empty_like")
    return empty(_shape_of(x), dtype=_like(x, dtype), device=device, requires_grad=requires_grad)


def full_like(x=None, fill_value=None, dtype=None, requires_grad=False, *, device=None, input=None):
    """A tensor of the shape of ``x`` filled with ``fill_value``, as ``torch.full_like``.

    Parameters
    ----------
    x : Tensor or array_like
        Whose shape (and, without ``dtype``, floating dtype) the result takes; ``input=`` is
        PyTorch's name for it.
    fill_value : scalar
        Every element's value.
    dtype : dtype, optional
        The result's dtype.
    requires_grad : bool
        Whether the result is a leaf that requires grad.
    device : optional
        Only ``"cpu"`` for eager tensors.

    Returns
    -------
    Tensor
    """
    x = _input(x, input, "full_like")
    return full(_shape_of(x), fill_value, _like(x, dtype), requires_grad, device=device)


def arange(start, end=None, step=1, dtype=None, requires_grad=False, *, device=None) -> Tensor:
    """Values from ``start`` (default 0) to ``end`` (excluded) by ``step``: ints give int64,
    floats the default float dtype."""
    check_device(device, "arange")
    v = np.arange(start, end, step) if end is not None else np.arange(start)
    return tensor(_float_default(v, dtype), requires_grad, dtype)


def linspace(start, end, steps=50, dtype=None, requires_grad=False, *, device=None) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` (both included)."""
    check_device(device, "linspace")
    return tensor(_float_default(np.linspace(start, end, steps), dtype), requires_grad, dtype)


def eye(n, m=None, dtype=None, requires_grad=False, *, device=None) -> Tensor:
    """The ``n`` x ``m`` identity (``m`` defaults to ``n``)."""
    check_device(device, "eye")
    return Tensor(np.eye(n, m, dtype=_dtype_or_default(dtype)), requires_grad)
