import tape as torch

torch.set_default_dtype(torch.float64)

# samples of a cubic with a small deterministic wiggle on top
x = torch.linspace(-1.0, 1.0, 41)
y = 0.5 - 1.2 * x + 0.3 * x**2 + 0.8 * x**3 + 0.05 * torch.cos(7 * x)

a = torch.zeros((), requires_grad=True)
b = torch.zeros((), requires_grad=True)
c = torch.tensor(0.0, requires_grad=True)
d = torch.tensor(0.0, requires_grad=True)
print(a, d)

learning_rate = 0.4
for it in range(601):
    prediction = a + b * x + c * x**2 + d * x.pow(3)
    loss = (prediction - y).pow(2).mean()
    if it % 100 == 0:
        print(f"iteration {it:3d}: loss {loss.item():.8f}")
    loss.backward()
    with torch.no_grad():
        a -= learning_rate * a.grad
        b -= learning_rate * b.grad
        c -= learning_rate * c.grad
        d -= learning_rate * d.grad
    a.grad = None
    b.grad = None
    c.grad = None
    d.grad = None

print(f"fit: y = {a.item():.5f} + {b.item():.5f} x + {c.item():.5f} x^2 + {d.item():.5f} x^3")
print(a.requires_grad, a.is_leaf, a.grad)
print(torch.stack([a, b, c, d]).detach())

# a second pass with the coefficients in one vector and in-place updates
coef = torch.zeros(4, requires_grad=True)
powers = torch.stack([x**0, x, x**2, x**3], dim=1)
for _ in range(301):
    loss = ((powers @ coef - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        coef.sub_(coef.grad, alpha=learning_rate)
    coef.grad.zero_()
print(f"vector fit loss {loss.item():.8f}")
print(coef)
