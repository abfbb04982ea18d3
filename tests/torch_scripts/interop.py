import tape as torch  # isort: skip  (first: the PyTorch run replaces this line)

import numpy as np

torch.set_default_dtype(torch.float64)

# the GPU question scripts ask first; this run has no CUDA tensors
device = "cuda" if torch.cuda.is_available() else "cpu"
print("device:", device, "count:", torch.cuda.device_count())
torch.cuda.manual_seed(0)
torch.manual_seed(0)

# from_numpy and as_tensor share the array's memory
a = np.arange(4.0)
t = torch.from_numpy(a)
u = torch.as_tensor(a)
a[0] = 10.0
print("shared:", t.tolist(), u.tolist())
t[1] = 20.0
print("array after a write through the tensor:", a.tolist())
print("numpy() shares the array:", np.shares_memory(t.numpy(), a))

# retain_grad keeps a non-leaf's gradient
x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
y = x * x
y.retain_grad()
z = (y * torch.tensor([1.0, 0.5, 0.25])).sum()
z.backward()
print("y.grad:", y.grad.tolist(), "x.grad:", x.grad.tolist(), "retains:", y.retains_grad)

# new_* constructors take the tensor's dtype
w = torch.tensor([1.0, 2.0], dtype=torch.float32)
print("new_ones:", w.new_ones(2, 3).dtype == torch.float32, tuple(w.new_ones(2, 3).shape))
print("new_zeros:", w.new_zeros((3,)).tolist())
print("new_full:", w.new_full((2,), 7.0).tolist())
print("new_tensor:", w.new_tensor([3, 4]).dtype == torch.float32, w.new_tensor([3, 4]).tolist())

# PyTorch's gradcheck signatures
q = torch.tensor([0.3, -0.7], requires_grad=True)
c = torch.tensor([1.5, 2.0])
print("gradcheck:", torch.autograd.gradcheck(lambda a, b: (a * b).sin(), (q, c)))
print("gradgradcheck:", torch.autograd.gradgradcheck(lambda a: a.tanh() * a, (q,)))

# .grad assignments are checked
for bad in (1.0, torch.zeros(2), torch.zeros(3, dtype=torch.float32)):
    try:
        x.grad = bad
    except (TypeError, RuntimeError) as e:
        print("grad assignment:", type(e).__name__)
x.grad = None
print("grad after None:", x.grad)

# PyTorch's keyword names and out=
m = torch.matmul(input=torch.tensor([[1.0, 2.0]]), other=torch.tensor([[3.0], [4.0]]))
print("matmul(input=, other=):", m.tolist())
o = torch.empty(2)
r = torch.add(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), alpha=2, out=o)
print("add(..., alpha=2, out=o):", o.tolist(), r is o)
