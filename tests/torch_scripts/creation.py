import tape as torch

torch.set_default_dtype(torch.float64)
print("default dtype is float64:", torch.get_default_dtype() == torch.float64)

# pick a device the way PyTorch code usually does
accel = (
    torch.accelerator.current_accelerator()
    if torch.accelerator.is_available()
    else torch.device("cpu")
)
print("chosen device type is known:", accel.type in ("cpu", "cuda", "mps", "xpu"))
device = torch.device("cpu")  # this script compares numbers, so it stays on the CPU
print("device:", device, device.type)

# deterministic constructors
z = torch.zeros(2, 3, device=device)
o = torch.ones((2, 3), dtype=torch.float64, device=device)
f = torch.full((2, 2), 3.5, device=device)
e = torch.eye(2, 3, device=device)
a = torch.arange(0, 10, 3, device=device)
af = torch.arange(0.0, 1.0, 0.25)
ls = torch.linspace(-1, 1, steps=5, device=device)
t = torch.tensor([[1, 2], [3, 4]], dtype=torch.float, device=device)
print(z)
print(o)
print(f)
print(e)
print(a)
print(af)
print(ls)
print(t.to(torch.double))
print(tuple(z.shape), list(o.size()), e.size(1), a.numel(), z.dim())
print(z.shape, o.size(), torch.Size([2, 3]) == z.shape)
print(f"Shape of tensor: {z.shape}")
print("a shape's part and count:", z.shape[1:] == (3,), z.shape.numel())
b = torch.arange(24.0).reshape(2, 3, 4)
print(torch.flatten(b, 1).shape, torch.transpose(b, 0, 1).shape, b.flatten(1).sum().item())
print(
    torch.unsqueeze(input=b, dim=1).shape,
    torch.squeeze(b[:1], dim=0).shape,
    torch.transpose(input=b, dim0=2, dim1=0)[1, 2, 0].item(),
)
print("arange int64:", a.dtype == torch.int64, a.dtype == torch.long)
print("tensor float32:", t.dtype == torch.float32, t.dtype == torch.float)
print("bool:", (a > 2).dtype == torch.bool, a > 2)
print("float64 default:", ls.dtype == torch.float64, z.dtype == torch.double)
print(
    "empty:",
    tuple(torch.empty(3, 4, device=device).shape),
    torch.empty(2, dtype=torch.long).dtype == torch.int64,
)

# .to(device) keeps values and dtype
moved = t.to(device)
print(moved.device.type, moved.dtype == torch.float32, bool((moved == t).all()))
both = t.to(device=device, dtype=torch.float64)
print(both.device == device, both.dtype == torch.float64, both.sum().item())

# random constructors: compare shapes, dtypes, ranges, reproducibility only
torch.manual_seed(0)
r1 = torch.randn(4, 5, device=device)
u1 = torch.rand(1000, device=device)
i1 = torch.randint(0, 10, (3, 4), device=device)
torch.manual_seed(0)
r2 = torch.randn(4, 5, device=device)
u2 = torch.rand(1000, device=device)
i2 = torch.randint(0, 10, (3, 4), device=device)
print("reseed equal:", bool((r1 == r2).all()), bool((u1 == u2).all()), bool((i1 == i2).all()))
print("randn:", tuple(r1.shape), r1.dtype == torch.float64)
print(
    "rand in [0, 1):",
    bool((u1 >= 0).all()),
    bool((u1 < 1).all()),
    u1.min().item() < 0.1,
    u1.max().item() > 0.9,
)
print("randint:", i1.dtype == torch.int64, bool((i1 >= 0).all()), bool((i1 < 10).all()))
coin = torch.randint(low=0, high=2, size=(50,))
print("randint keywords:", tuple(coin.shape), coin.min().item() >= 0, coin.max().item() <= 1)
rl = torch.randn_like(r1)
ul = torch.rand_like(u1)
print("like:", tuple(rl.shape), rl.dtype == r1.dtype, tuple(ul.shape))
n = torch.normal(2.0, 0.5, size=(2000,))
print("normal:", tuple(n.shape), abs(n.mean().item() - 2.0) < 0.1, abs(n.std().item() - 0.5) < 0.1)
nt = torch.normal(torch.zeros(3), torch.ones(3))
print("normal(tensor, tensor):", tuple(nt.shape))
r32 = torch.randn(3, dtype=torch.float32)
print("randn float32:", r32.dtype == torch.float32)

# the default device
torch.set_default_device("cpu")
print("default device:", torch.ones(1).device.type)
torch.set_default_device(torch.device("cpu"))
print(
    "default device:",
    torch.get_default_device().type,
    torch.zeros(2, 2).device == torch.device("cpu"),
)
