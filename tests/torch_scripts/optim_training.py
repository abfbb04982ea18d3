import tape as torch

F = torch.nn.functional
torch.set_default_dtype(torch.float64)

A = torch.tensor([[3.0, 1.0], [1.0, 2.0], [0.0, 1.0]])
b = torch.tensor([1.0, -1.0, 0.5])


def objective(w):
    return ((A @ w - b) ** 2).sum()


def run(make_optimizer, steps=6):
    w = torch.tensor([0.5, -0.5], requires_grad=True)
    opt = make_optimizer([w])
    for _ in range(steps):
        opt.zero_grad()
        loss = objective(w)
        loss.backward()
        opt.step()
    return w, opt


print("-- optimizers")
configs = [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.02)),
    ("sgd momentum", lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9)),
    ("sgd nesterov", lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9, nesterov=True)),
    ("sgd weight_decay", lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.5, weight_decay=0.1)),
    ("sgd dampening", lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.5, dampening=0.5)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.1)),
    ("adam betas", lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), weight_decay=0.01)),
    ("adam amsgrad", lambda p: torch.optim.Adam(p, lr=0.1, amsgrad=True)),
    ("adamw", lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.5)),
]
for name, make in configs:
    w, opt = run(make)
    print(f"{name}: {w[0].item():.8f} {w[1].item():.8f} loss {objective(w).item():.8f}")

print("-- zero_grad and state_dict")
w, opt = run(lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9), steps=3)
print(w.grad is None)
opt.zero_grad(set_to_none=True)
print(w.grad)
objective(w).backward()
opt.zero_grad(set_to_none=False)
print(w.grad)
sd = opt.state_dict()
print(sorted(sd.keys()))
group = sd["param_groups"][0]
print(group["lr"], group["momentum"], group["nesterov"], group["weight_decay"], group["params"])
print(list(sd["state"].keys()), list(sd["state"][0].keys()))
print(sd["state"][0]["momentum_buffer"])

w, opt = run(lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.9, 0.999)), steps=4)
sd = opt.state_dict()
state = sd["state"][0]
print(sorted(state.keys()), int(state["step"]))
print(sd["param_groups"][0]["betas"], sd["param_groups"][0]["eps"])
print(state["exp_avg"])
print(state["exp_avg_sq"])
opt.param_groups[0]["lr"] = 0.01
print(opt.state_dict()["param_groups"][0]["lr"])

print("-- two-layer network")
# three classes on a 5 x 5 grid of points
xs = torch.linspace(-1, 1, 5)
X = torch.stack(
    [xs.view(-1, 1).expand(5, 5).reshape(-1), xs.view(1, -1).expand(5, 5).reshape(-1)], dim=1
)
y = torch.tensor(
    [
        0,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        1,
        1,
        0,
        0,
        1,
        1,
        1,
        2,
        2,
        2,
        1,
        1,
        2,
        2,
        2,
        2,
        1,
    ]
)
print(tuple(X.shape), tuple(y.shape), X[7])

hidden = 8
W1 = (torch.arange(2.0 * hidden).view(hidden, 2).sin() * 0.8).requires_grad_()
b1 = torch.zeros(hidden, requires_grad=True)
W2 = (torch.arange(3.0 * hidden).view(3, hidden).cos() * 0.5).requires_grad_()
b2 = torch.zeros(3, requires_grad=True)
params = [W1, b1, W2, b2]
optimizer = torch.optim.Adam(params, lr=0.05)


def model(inputs):
    h = torch.tanh(F.linear(inputs, W1, b1))
    return F.linear(h, W2, b2)


for step in range(151):
    optimizer.zero_grad(set_to_none=True)
    logits = model(X)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    if step % 30 == 0:
        with torch.no_grad():
            accuracy = (model(X).argmax(dim=1) == y).double().mean()
        print(f"step {step:3d} loss {loss.item():.6f} accuracy {accuracy.item():.2f}")

with torch.no_grad():
    probs = F.softmax(model(X[:3]), dim=1)
print(probs)
print(W1.is_leaf, W1.grad.shape == W1.shape, b2.grad.abs().max().item() < 1.0)
