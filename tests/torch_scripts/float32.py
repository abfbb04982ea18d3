import tape as torch

torch.set_default_dtype(torch.float32)
print(torch.get_default_dtype() == torch.float32, torch.get_default_dtype() == torch.float)

print("-- creation follows the default dtype")
made = {
    "tensor": torch.tensor([1.0, 2.0]),
    "zeros": torch.zeros(2),
    "ones": torch.ones(2, 2),
    "full": torch.full((2,), 7.0),
    "eye": torch.eye(3),
    "arange": torch.arange(0.0, 2.0, 0.5),
    "linspace": torch.linspace(0, 1, 4),
    "empty": torch.empty(3),
    "rand": torch.rand(3),
    "randn": torch.randn(3),
    "normal": torch.normal(0.0, 1.0, size=(3,)),
}
for name, t in made.items():
    print(name, t.dtype == torch.float32)
print("ints", torch.tensor([1, 2]).dtype == torch.int64, torch.arange(3).dtype == torch.long)
print("bools", torch.tensor([True, False]).dtype == torch.bool)
print(
    "explicit",
    torch.ones(2, dtype=torch.float).dtype == torch.float32,
    torch.ones(2, dtype=torch.double).dtype == torch.float64,
    torch.zeros(2, dtype=torch.int64).dtype == torch.int64,
)

print("-- promotion")
f = torch.tensor([1.0, 2.0, 3.0])
g = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
i = torch.tensor([1, 2, 3])
print((f * 2.5).dtype == torch.float32)
print((f + g).dtype == torch.float64)
print((i + 0.5).dtype == torch.float32)
print((i / 2).dtype == torch.float32)
print((i * 2).dtype == torch.int64)
print(
    f.double().dtype == torch.float64,
    g.float().dtype == torch.float32,
    g.to(torch.float).dtype == torch.float32,
)
print(i.type_as(f).dtype == torch.float32)

print("-- single-precision arithmetic")
print(f"{(torch.tensor(0.1) + 0.2).item():.10f}")
print(f"{(torch.tensor(0.1, dtype=torch.float64) + 0.2).item():.10f}")
print((torch.tensor(1.0) + 1e-8).item() == 1.0)
print(f"{torch.tensor(1.0 / 3.0).item():.12f}")
print(f"{torch.tensor([2.0]).sqrt().item():.10f}")
print(f)
print(f / 3)
print(torch.linspace(0, 1, 5))

print("-- autograd in float32")
w = torch.tensor([0.1, 0.2, -0.3], requires_grad=True)
loss = (w * 3).pow(2).sum()
loss.backward()
print(w.grad.dtype == torch.float32)
print(w.grad)
print(f"{loss.item():.6f}")
x = torch.tensor([[0.5, -1.0], [2.0, 0.0], [1.0, 1.0]])
target = torch.tensor([1, 0, 1])
weight = torch.zeros(2, 2, dtype=torch.float, requires_grad=True)
opt = torch.optim.SGD([weight], lr=0.5, momentum=0.9)
for _ in range(5):
    opt.zero_grad()
    out = torch.nn.functional.cross_entropy(x @ weight, target)
    out.backward()
    opt.step()
print(weight.dtype == torch.float32, weight.grad.dtype == torch.float32, out.dtype == torch.float32)
print(f"{out.item():.5f}")
print(weight)
