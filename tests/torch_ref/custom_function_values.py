#!/usr/bin/env python3
"""PyTorch's values for examples/custom_function.rs: the three examples of
"Extending torch.func with autograd.Function" (NumpySort, NumpyTake, MyCube),
as the page writes them, evaluated on the example's inputs. Prints one JSON
object; tests/fixtures/custom_function_values.json is its output.

    python3 tests/torch_ref/custom_function_values.py > tests/fixtures/custom_function_values.json
"""

import json

import numpy as np
import torch
from torch.func import grad, jvp, vmap


def to_numpy(tensor):
    return tensor.cpu().numpy()


class NumpySort(torch.autograd.Function):
    @staticmethod
    def forward(x, dim):
        device = x.device
        x = to_numpy(x)
        ind = np.argsort(x, axis=dim)
        ind_inv = np.argsort(ind, axis=dim)
        result = np.take_along_axis(x, ind, axis=dim)
        return (
            torch.tensor(result, device=device),
            torch.tensor(ind, device=device),
            torch.tensor(ind_inv, device=device),
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim = inputs
        _, ind, ind_inv = output
        ctx.mark_non_differentiable(ind, ind_inv)
        ctx.save_for_backward(ind, ind_inv)
        ctx.save_for_forward(ind, ind_inv)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, grad_output, _0, _1):
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(grad_output, ind_inv, ind, ctx.dim), None

    @staticmethod
    def vmap(info, in_dims, x, dim):
        x_bdim, _ = in_dims
        x = x.movedim(x_bdim, 0)
        dim = dim if dim >= 0 else dim + x.dim() - 1
        return NumpySort.apply(x, dim + 1), (0, 0, 0)

    @staticmethod
    def jvp(ctx, x_tangent, _):
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(x_tangent, ind, ind_inv, ctx.dim), None, None


class NumpyTake(torch.autograd.Function):
    @staticmethod
    def forward(x, ind, ind_inv, dim):
        device = x.device
        x = to_numpy(x)
        ind = to_numpy(ind)
        return torch.tensor(np.take_along_axis(x, ind, dim), device=device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ind, ind_inv, dim = inputs
        ctx.save_for_backward(ind, ind_inv)
        ctx.save_for_forward(ind, ind_inv)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, grad_output):
        ind, ind_inv = ctx.saved_tensors
        result = NumpyTake.apply(grad_output, ind_inv, ind, ctx.dim)
        return result, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, ind, ind_inv, dim):
        x_bdim, ind_bdim, ind_inv_bdim, _ = in_dims
        logical_dim = x.dim() if x_bdim is None else x_bdim - 1
        dim = dim if dim >= 0 else dim + logical_dim

        def maybe_expand_bdim_at_front(x, x_bdim):
            if x_bdim is None:
                return x.expand(info.batch_size, *x.shape)
            return x.movedim(x_bdim, 0)

        x = maybe_expand_bdim_at_front(x, x_bdim)
        ind = maybe_expand_bdim_at_front(ind, ind_bdim)
        ind_inv = maybe_expand_bdim_at_front(ind_inv, ind_inv_bdim)
        return NumpyTake.apply(x, ind, ind_inv, dim + 1), 0

    @staticmethod
    def jvp(ctx, x_tangent, ind_tangent, ind_inv_tangent, _):
        assert ind_tangent is None
        assert ind_inv_tangent is None
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(x_tangent, ind, ind_inv, ctx.dim)


class MyCube(torch.autograd.Function):
    @staticmethod
    def forward(x):
        result = x**3
        dx = 3 * x**2
        return result, dx

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        result, dx = output
        ctx.save_for_backward(x, dx)

    @staticmethod
    def backward(ctx, grad_output, grad_dx):
        x, dx = ctx.saved_tensors
        result = grad_output * dx + grad_dx * 6 * x
        return result


class MyCubeGenerated(MyCube):
    generate_vmap_rule = True


def numpy_sort(x, dim=-1):
    return NumpySort.apply(x, dim)


def my_cube(x):
    return MyCube.apply(x)


def main():
    x = torch.tensor([[0.5, -1.0, 2.0, 0.25], [3.0, 1.5, -0.5, 0.0]])
    w = torch.arange(8).view(2, 4)
    t = torch.arange(8).view(2, 4) / 10
    v = {
        "sort": numpy_sort(x, 1)[0],
        "sort_grad": grad(lambda x: (numpy_sort(x, 1)[0] * w).sum())(x),
        "sort_jvp": jvp(lambda x: numpy_sort(x, 1)[0], (x,), (t,))[1],
        "sort_vmap": vmap(lambda r: numpy_sort(r, 0)[0])(x),
        "sort_vmap_grad": vmap(grad(lambda r, wr: (numpy_sort(r, 0)[0] * wr).sum()))(x, w),
        "cube": my_cube(x)[0],
        "cube_grad": grad(lambda x: my_cube(x)[0].sum())(x),
        "cube_grad_grad": grad(lambda x: grad(lambda y: my_cube(y)[0].sum())(x).sum())(x),
        "cube_vmap_generated": vmap(MyCubeGenerated.apply)(x)[0],
    }
    print(json.dumps({k: t.float().tolist() for k, t in v.items()}, indent=1))


if __name__ == "__main__":
    main()
