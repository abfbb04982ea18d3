"""The seed lessons (shared/seeds/), reproduced line by line with ``import tape as torch``."""

import gc
import sys
import weakref

import numpy as np
import pytest

import tape as torch


def test_lesson_one_gradient(capsys):
    w = torch.tensor(2.0, requires_grad=True)
    prediction = 3 * w
    loss = (prediction - 1).square()
    print(loss)
    print(loss.shape)
    print(w.grad)
    loss.backward()
    print(w.grad)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tensor(25., grad_fn=")
    assert out[1] == "torch.Size([])"  # the lesson's comment
    assert out[2] == "None"
    assert out[3] == "tensor(30.)"
    assert loss.item() == 25.0
    assert w.grad.item() == 30.0
    assert w.is_leaf and not loss.is_leaf
    assert w.grad_fn is None and loss.grad_fn is not None


def test_lesson_batch_objective(capsys):
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    target = torch.tensor([0.0, 2.0])
    w = torch.tensor([1.0, -1.0], requires_grad=True)
    b = torch.tensor(0.0, requires_grad=True)
    prediction = x @ w + b
    errors = prediction - target
    loss = errors.square().mean()
    print(prediction)
    print(errors)
    print(errors.shape)
    print(loss)
    print(loss.shape)
    loss.backward()
    print(w.grad)
    print(b.grad)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tensor([-1., -1.], grad_fn=")
    assert out[1].startswith("tensor([-1., -3.], grad_fn=")
    assert out[2] == "torch.Size([2])"
    assert out[3].startswith("tensor(5., grad_fn=")
    assert out[4] == "torch.Size([])"
    assert out[5] == "tensor([-10., -14.])"
    assert out[6] == "tensor(-4.)"
    # the lesson's hand derivation: d loss / d b is the mean of 2 * errors
    np.testing.assert_allclose(b.grad.numpy(), np.mean(2 * errors.numpy()))
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ (2 * errors.numpy()) / 2)
    assert not x.requires_grad and x.grad is None and target.grad is None


def test_lesson_accumulation(capsys):
    w = torch.tensor(2.0, requires_grad=True)
    for _ in range(2):
        loss = (3 * w - 1).square()  # Build a fresh graph
        loss.backward()
        print(w.grad.item())  # First 30.0, then 60.0
    w.grad = None  # Clear the accumulated gradient
    loss = (3 * w - 1).square()
    loss.backward()
    print(w.grad.item())  # 30.0 again
    assert capsys.readouterr().out.split() == ["30.0", "60.0", "30.0"]


def test_zero_grad_in_place_and_item_after_backward():
    w = torch.tensor(2.0, requires_grad=True)
    (3 * w - 1).square().backward()
    w.grad.zero_()
    assert w.grad.item() == 0.0
    loss = (3 * w - 1).square()
    assert loss.item() == 25.0
    loss.backward()
    assert w.grad.item() == 30.0


def test_unscaled_gradient_scenario():
    # a tensor with requires_grad, a simple arithmetic loss, backward, read A.grad
    A = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    loss = (A * 3 + 2).sum()
    loss.backward()
    unscaled_grad = A.grad
    np.testing.assert_array_equal(unscaled_grad.numpy(), [3.0, 3.0, 3.0])
    B = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    (B**3).sum().backward()
    np.testing.assert_allclose(B.grad.numpy(), 3 * B.numpy() ** 2)


def test_backward_twice_on_one_graph_raises_unless_retained():
    # PyTorch's error: the graph is spent after a backward without retain_graph=True
    w = torch.tensor(2.0, requires_grad=True)
    loss = (3 * w - 1).square()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()
    assert w.grad.item() == 30.0
    w.grad = None
    loss = (3 * w - 1).square()
    loss.backward(retain_graph=True)
    loss.backward()
    assert w.grad.item() == 60.0


def test_graph_is_freed_with_its_last_tensor():
    w = torch.tensor(2.0, requires_grad=True)
    loss = (3 * w - 1).square()
    ref = weakref.ref(loss._tape)
    loss.backward()
    del loss
    gc.collect()
    assert ref() is None


def _current_rss_kib():
    # resident memory now (/proc/self/statm), not the peak: compiles have already pushed the
    # peak to gigabytes, and a peak that a leak stays under would hide it
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_training_loop_memory_is_bounded():
    w = torch.tensor(2.0, requires_grad=True)
    kept = []

    def loop(n, leak=False):
        for _ in range(n):
            loss = (3 * w - 1).square()
            loss.backward()
            w.grad = None
            if leak:
                kept.append(loss)

    loop(5_000)
    gc.collect()
    before = _current_rss_kib()
    loop(50_000)
    gc.collect()
    grew = _current_rss_kib() - before
    assert grew < 10_000, f"RSS grew by {grew} KiB over 50,000 iterations"
    # the measure sees a leak of this size: keeping every loss (and its graph) grows it
    loop(50_000, leak=True)
    assert _current_rss_kib() - before > 10_000


def test_loop_without_backward_stays_bounded():
    # expressions starting from the same leaf share an open tape, but only up to a limit
    from tape.frontend.tensor import REUSE_LIMIT

    w = torch.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3 * REUSE_LIMIT):
        y = (w * 2).sum()
    assert len(y._tape) <= REUSE_LIMIT + 2
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0])
