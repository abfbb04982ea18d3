import tape as torch

torch.set_default_dtype(torch.float64)

# a gradient penalty: the input gradient's norm, differentiated again
x = torch.tensor([[0.3, -0.7, 1.1], [0.5, 0.2, -0.4]], requires_grad=True)
w = torch.tensor([[0.5, -0.2], [0.3, 0.8], [0.1, -0.4]], requires_grad=True)
b = torch.tensor([0.1, -0.1], requires_grad=True)
out = torch.tanh(x @ w + b)
loss = (out**2).sum()
(gx,) = torch.autograd.grad(loss, x, create_graph=True)
penalty = (gx.norm(dim=1) - 1.0).pow(2).mean()
total = loss + 10.0 * penalty
total.backward()
print("loss:", round(loss.item(), 10), "penalty:", round(penalty.item(), 10))
print("w.grad:", [[round(v, 10) for v in row] for row in w.grad.tolist()])
print("b.grad:", [round(v, 10) for v in b.grad.tolist()])
print("x.grad:", [[round(v, 10) for v in row] for row in x.grad.tolist()])

# double backward: backward(create_graph=True), then the gradient of the gradient
z = torch.tensor([0.5, -1.5, 2.0], requires_grad=True)
y = (z**3 + z.sin()).sum()
y.backward(create_graph=True)
g = z.grad
print("first:", [round(v, 10) for v in g.tolist()], g.requires_grad)
(h,) = torch.autograd.grad(g.sum(), z)
print("second:", [round(v, 10) for v in h.tolist()])
