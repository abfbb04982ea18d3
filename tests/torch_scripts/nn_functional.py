import tape as torch

F = torch.nn.functional
torch.set_default_dtype(torch.float64)


def show(name, value):
    print(f"{name}: {value.item():.6f}")


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


print("-- classification losses")
logits = torch.tensor(
    [[2.0, -1.0, 0.5], [0.1, 0.2, 3.0], [-1.0, 1.5, 0.0], [0.3, 0.3, -0.4]], requires_grad=True
)
target = torch.tensor([0, 2, 1, 1])
soft_target = torch.tensor([[0.7, 0.2, 0.1], [0.0, 0.0, 1.0], [0.25, 0.5, 0.25], [0.2, 0.2, 0.6]])
show("cross_entropy", F.cross_entropy(logits, target))
show("cross_entropy sum", F.cross_entropy(logits, target, reduction="sum"))
print(F.cross_entropy(logits, target, reduction="none").detach())
show("cross_entropy probs", F.cross_entropy(logits, soft_target))
print(F.cross_entropy(logits, soft_target, reduction="none").detach())
print(grad_of(F.cross_entropy(logits, target), logits))
print(grad_of(F.cross_entropy(logits, soft_target, reduction="sum"), logits))
log_probs = F.log_softmax(logits, dim=1)
show("nll_loss", F.nll_loss(log_probs, target))
show("nll_loss sum", F.nll_loss(log_probs, target, reduction="sum"))
print(F.nll_loss(log_probs, target, reduction="none").detach())
print(grad_of(F.nll_loss(F.log_softmax(logits, dim=-1), target), logits))
print(F.softmax(logits, dim=1).detach())
print(F.softmax(logits, dim=0).sum(dim=0).detach())
print("log_softmax rows sum to 1:", (log_probs.exp().sum(dim=1) - 1).abs().max().item() < 1e-12)

print("-- binary losses")
z = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0], requires_grad=True)
y = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
p = torch.sigmoid(z)
show("bce", F.binary_cross_entropy(p, y))
show("bce sum", F.binary_cross_entropy(p, y, reduction="sum"))
print(F.binary_cross_entropy(p, y, reduction="none").detach())
show("bce_with_logits", F.binary_cross_entropy_with_logits(z, y))
print(F.binary_cross_entropy_with_logits(z, y, reduction="none").detach())
print(grad_of(F.binary_cross_entropy(torch.sigmoid(z), y), z))
print(grad_of(F.binary_cross_entropy_with_logits(z, y, reduction="sum"), z))

print("-- regression losses")
pred = torch.tensor([[0.5, 2.0], [-1.0, 0.2], [3.0, 0.0]], requires_grad=True)
goal = torch.tensor([[0.0, 2.5], [1.0, 0.0], [0.5, 0.3]])
for reduction in ("mean", "sum", "none"):
    print(reduction)
    print(F.mse_loss(pred, goal, reduction=reduction).detach())
    print(F.l1_loss(pred, goal, reduction=reduction).detach())
    print(F.smooth_l1_loss(pred, goal, reduction=reduction).detach())
    print(F.smooth_l1_loss(pred, goal, reduction=reduction, beta=0.5).detach())
print(grad_of(F.mse_loss(pred, goal), pred))
print(grad_of(F.l1_loss(pred, goal, reduction="sum"), pred))
print(grad_of(F.smooth_l1_loss(pred, goal), pred))

print("-- activations")
x = torch.linspace(-3, 3, 7, requires_grad=True)
weights = torch.arange(1.0, 8.0)
activations = [
    ("relu", lambda t: F.relu(t)),
    ("leaky_relu", lambda t: F.leaky_relu(t, negative_slope=0.1)),
    ("elu", lambda t: F.elu(t, alpha=0.5)),
    ("gelu", lambda t: F.gelu(t)),
    ("gelu tanh", lambda t: F.gelu(t, approximate="tanh")),
    ("silu", lambda t: F.silu(t)),
    ("sigmoid", lambda t: F.sigmoid(t)),
    ("tanh", lambda t: F.tanh(t)),
    ("torch.sigmoid", lambda t: torch.sigmoid(t)),
    ("torch.tanh", lambda t: torch.tanh(t)),
    ("softplus", lambda t: F.softplus(t)),
    ("softplus beta", lambda t: F.softplus(t, beta=2.0, threshold=4.0)),
    ("relu method", lambda t: t.relu()),
]
for name, fn in activations:
    out = fn(x)
    (g,) = torch.autograd.grad((out * weights).sum(), x)
    print(name)
    print(out.detach())
    print(g)

print("-- linear and normalize")
inp = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], requires_grad=True)
weight = torch.tensor([[0.1, 0.2, 0.3], [-0.5, 0.5, 0.0]], requires_grad=True)
bias = torch.tensor([0.01, -0.02], requires_grad=True)
lin = F.linear(inp, weight, bias)
print(lin.detach())
print(F.linear(inp, weight).detach())
lin.pow(2).sum().backward()
print(inp.grad)
print(weight.grad)
print(bias.grad)
nrm = F.normalize(inp, dim=1)
print(nrm.detach())
print(F.normalize(inp, p=1.0, dim=0).detach())
print(grad_of((F.normalize(inp, p=2.0, dim=1) * torch.tensor([1.0, 2.0, -1.0])).sum(), inp))
