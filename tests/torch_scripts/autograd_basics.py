import tape as torch

torch.set_default_dtype(torch.float64)


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * y


class ScaledProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, scale):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return a * b * scale

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        print("needs_input_grad:", ctx.needs_input_grad)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = grad_output * b * ctx.scale
        if ctx.needs_input_grad[1]:
            grad_b = grad_output * a * ctx.scale
        return grad_a, grad_b, None


class RowMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        values, indices = x.max(dim=1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(x, indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        x, indices = ctx.saved_tensors
        columns = torch.arange(x.shape[1]).view(1, -1)
        mask = (columns == indices.view(-1, 1)).type_as(x)
        return mask * grad_values.view(-1, 1)


class StraightThroughClamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(min=-1.0, max=1.0)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


print("-- custom functions")
x = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
y = Exp.apply(x)
y.sum().backward()
print(y.detach())
print(x.grad)
print(torch.allclose(x.grad, x.detach().exp()))

a = torch.tensor([1.0, 2.0], requires_grad=True)
b = torch.tensor([3.0, -4.0])
out = ScaledProduct.apply(a, b, 0.5)
out.sum().backward()
print(a.grad)
print(b.grad)

m = torch.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], requires_grad=True)
vals, idx = RowMax.apply(m)
print(vals.requires_grad, idx.requires_grad)
print(idx)
(vals * torch.tensor([1.0, 10.0])).sum().backward()
print(m.grad)

s = torch.tensor([-3.0, 0.5, 2.0], requires_grad=True)
clamped = StraightThroughClamp.apply(s)
(clamped * clamped).sum().backward()
print(clamped.detach())
print(s.grad)

print("-- torch.autograd.grad")
x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
w = torch.tensor(0.5, requires_grad=True)
unused = torch.tensor(4.0, requires_grad=True)
loss = (x**2 * w).sum()
gx, gw = torch.autograd.grad(loss, [x, w], retain_graph=True)
print(gx, gw)
(gx_again,) = torch.autograd.grad(loss, x)
print(gx_again)
print(x.grad, w.grad)
try:
    torch.autograd.grad(loss, x)
except RuntimeError:
    print("graph freed: RuntimeError")
gx, gu = torch.autograd.grad((x * w).sum(), (x, unused), allow_unused=True)
print(gx, gu)
try:
    torch.autograd.grad((x * w).sum(), (x, unused))
except RuntimeError:
    print("unused input: RuntimeError")
vec = x * 3
(gv,) = torch.autograd.grad(vec, x, grad_outputs=torch.tensor([1.0, 0.0, -1.0]))
print(gv)
(gm,) = torch.autograd.grad(
    loss.detach() + (x * x).sum(), x, grad_outputs=None, retain_graph=None, allow_unused=False
)
print(gm)

print("-- torch.autograd.backward")
p = torch.tensor([1.0, 2.0], requires_grad=True)
torch.autograd.backward([(p * p).sum(), (3 * p).sum()])
print(p.grad)
torch.autograd.backward(p * 2, grad_tensors=torch.tensor([1.0, 0.5]))
print(p.grad)

print("-- accumulation and retain_graph")
w = torch.tensor([1.0, -1.0, 2.0], requires_grad=True)
loss = (w**3).sum()
loss.backward(retain_graph=True)
print(w.grad)
loss.backward()
print(w.grad)
w.grad = None
print(w.grad)
try:
    loss.backward()
except RuntimeError:
    print("second backward without retain_graph: RuntimeError")
(w * w).sum().backward()
print(w.grad)
w.grad.zero_()
print(w.grad)
y = w * torch.tensor([1.0, 2.0, 3.0])
y.backward(torch.ones_like(y))
print(w.grad)

print("-- detach and no_grad")
d = w.detach()
print(d.requires_grad, d.grad_fn is None, d.is_leaf)
with torch.no_grad():
    n = w * 2
print(n.requires_grad, n.grad_fn is None)
print(torch.is_grad_enabled())


@torch.no_grad()
def double(t):
    return t * 2


print(double(w).requires_grad)
w.grad = None
half_frozen = (w * w.detach()).sum()
half_frozen.backward()
print(w.grad)
leaf = torch.zeros(2)
print(leaf.requires_grad)
leaf.requires_grad_()
(leaf + 1).pow(2).sum().backward()
print(leaf.grad)
print(loss.requires_grad, loss.grad_fn is not None, loss.is_leaf, w.is_leaf)
