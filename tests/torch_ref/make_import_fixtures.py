"""Import fixtures: models exported with torch.export, and what eager PyTorch
computes for them.

For each model below this writes, under tests/fixtures/import/:

- NAME.pt2: torch.export.save(torch.export.export(model.eval(), args));
- NAME.inputs.safetensors: the user inputs, by the names torch.export gives
  them (the forward's argument names);
- NAME.expected.safetensors: what `kiln run NAME.pt2` must write: the
  flattened outputs as output.0, output.1, ..., each buffer the program
  mutates under its state-dict name (its final value), each user input
  the program mutates under its own name (its final value); nothing the
  program only reads.

Weights are random (seeded), and models are kept small: the committed
archives hold their weights. Families come from their own libraries
(torchvision's MobileNet, ShuffleNet, SqueezeNet and blocks), at reduced
widths. Run with `--check` to regenerate in memory and compare with the
committed files (archives compared by graph and weights, not bytes: zip
timestamps differ).

    python3 tests/torch_ref/make_import_fixtures.py [--only NAME] [--check]
"""

import argparse
import copy
import io
import os
import sys
import zipfile

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "import")


class SmallCnnCache(torch.nn.Module):
    """Conv, batch norm, hardswish, pooling; a buffer written through
    index_copy_ and a result mutated in place."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.register_buffer("cache", torch.zeros(4, 8))
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x, idx):
        y = torch.nn.functional.hardswish(self.bn(self.conv(x)))
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        self.cache.index_copy_(0, idx, y)
        y.relu_()
        return self.fc(y), y.sum()


class ConvZoo(torch.nn.Module):
    """Convolutions of every form: stride, padding, dilation, groups,
    depthwise, 1x1, `same`, 1-d; max and average pools with ceil mode and
    padding; hardtanh / relu6 / hardsigmoid in place."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
        self.dw = torch.nn.Conv2d(8, 8, 5, padding=2, groups=8, bias=False)
        self.pw = torch.nn.Conv2d(8, 6, 1)
        self.same = torch.nn.Conv2d(6, 6, (2, 3), padding="same")
        self.c1 = torch.nn.Conv1d(6, 4, 3, stride=2)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.a(x))
        y = self.b(y)
        torch.nn.functional.hardtanh_(y, -0.5, 0.75)
        y = self.dw(y) + y
        y = torch.nn.functional.hardsigmoid(self.pw(y), inplace=True)
        y = self.same(y)
        p = torch.nn.functional.max_pool2d(y, 3, stride=2, padding=1, ceil_mode=True)
        q = torch.nn.functional.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True,
                                           count_include_pad=False)
        r = torch.nn.functional.avg_pool2d(y, 2)
        s = torch.nn.functional.adaptive_avg_pool2d(y, (3, 2))
        t = self.c1(y.flatten(2))
        return p, q, r, s, t


class KvCache(torch.nn.Module):
    """A decoder step the eager way: keys and values written into buffers
    through index_copy_ and slice assignment, attention over the cache."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.kv = torch.nn.Linear(16, 32)
        self.register_buffer("k_cache", torch.zeros(1, 2, 8, 8))
        self.register_buffer("v_cache", torch.zeros(1, 2, 8, 8))

    def forward(self, x, pos):
        q = self.q(x).view(1, 2, 2, 8).transpose(1, 2)
        k, v = self.kv(x).split(16, dim=-1)
        k = k.view(1, 2, 2, 8).transpose(1, 2)
        v = v.view(1, 2, 2, 8).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache[:, :, 2:4] = v
        att = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        return att.transpose(1, 2).reshape(1, 2, 16)


class CoreOps(torch.nn.Module):
    """Core ATen ops added for issue 74, exported in training mode after
    `run_decompositions()`: atan2, fmod, isnan / isinf, logical_xor, prod,
    any, var (.dim, .default), divide, native layer and group norms,
    `_native_batch_norm_legit_functional` (its running statistics written
    back) and `scalar_tensor`."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.gn = torch.nn.GroupNorm(2, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x, y):
        a = torch.atan2(x, y) + torch.fmod(x, 0.7)
        b = self.ln(a)
        c = b.prod(-1, keepdim=True) + b.var(1, unbiased=False, keepdim=True)
        d = torch.where(torch.isnan(b) | torch.isinf(b), 0.0, b)
        e = (d > 0).any(-1, keepdim=True).float() + torch.divide(d, 2.0)
        g = self.gn(e.unsqueeze(-1)).squeeze(-1)
        h = self.bn(g)
        return h * c + torch.logical_xor(d > 0, x > 0).float() + d.var()


class ImporterDefects(torch.nn.Module):
    """Issue 74's importer defects, each as a user writes it: a fully masked
    attention row (eager: zeros), grouped-query attention, clone and
    contiguous with memory formats then `view`, adaptive pooling to sizes
    that do not divide then `view`, index_add on a 0-d tensor, negative
    replicate padding, scatter's reduce overloads, round with decimals,
    std / var without dims."""

    def forward(self, q, k, v, mask, x, img):
        F = torch.nn.functional
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        g = F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], enable_gqa=True)
        c = img.transpose(2, 3).clone(memory_format=torch.contiguous_format).view(img.shape[0], -1)
        cl = img.clone(memory_format=torch.channels_last) * 2 + img.contiguous(memory_format=torch.channels_last)
        p = F.adaptive_avg_pool2d(img, (3, 3)).view(img.shape[0], -1)
        z = torch.index_add(x.sum(), 0, torch.tensor(0), x[0, 0])
        r = F.pad(img, (-1, 2, 1, -1), mode="replicate")
        i = torch.tensor([[0, 2, 1], [3, 0, 3]])
        s = x.scatter(0, i, x[:2] * 3, reduce="add") + x.scatter(0, i, 2.0, reduce="multiply")
        d = torch.round(x, decimals=2) + torch.round(x * 100, decimals=-1)
        return a, g, c, cl, p, z, r, s, d, torch.std(x) + torch.var(x, unbiased=False)


class AliasesAndViews(torch.nn.Module):
    """ATen's aliases and views by other names as exports record them
    (`subtract`, `clip`, `swapaxes`, `moveaxis`, `mT`, `broadcast_to`, ...),
    and composites of the training IR (`cross_entropy`, `pixel_shuffle`,
    `glu`, `prelu`, `one_hot`, `repeat_interleave`, `cumprod`, `einsum`
    aside)."""

    def __init__(self):
        super().__init__()
        self.prelu = torch.nn.PReLU(4)

    def forward(self, x, t):
        F = torch.nn.functional
        a = torch.subtract(x, 1.5).clip(-1, 1) + torch.multiply(x, 2).negative().absolute()
        b = x.swapaxes(1, 2).moveaxis(0, -1).mT.contiguous()
        c = torch.broadcast_to(x[:1], x.shape) * torch.square(x)
        d = F.pixel_shuffle(self.prelu(x), 2)
        e = F.glu(x, dim=1) + F.logsigmoid(x[:, :2]) + F.selu(x[:, 2:]) + F.celu(x[:, :2])
        f = F.cross_entropy(x.flatten(2).mean(-1), t, label_smoothing=0.1)
        g = F.one_hot(t, 4).float().cumprod(1) + t.repeat_interleave(2).float().sum()
        h = torch.linalg.vector_norm(x, ord=3, dim=(1, 2)) + torch.logaddexp(x, -x).sum((1, 2))
        return a, b, c, d, e, f, g, h


class ViewsInPlace(torch.nn.Module):
    """Views written in place, in-place view ops, dtype round trips."""

    def forward(self, x):
        y = x.clone()
        y[0].mul_(2)
        y.t_()
        d = y.diagonal()
        d.add_(1)
        z = y.to(torch.float16).to(torch.float32)
        w = z.unsqueeze(0)
        w.squeeze_(0)
        x.add_(torch.nn.functional.dropout(w, 0.5, training=False))
        return y, z.new_ones(3) + z.sum()


def mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10)


def mobilenet_v3_small():
    import torchvision
    return torchvision.models.mobilenet_v3_small(width_mult=0.25, num_classes=10)


def shufflenet():
    import torchvision
    from torchvision.models.shufflenetv2 import ShuffleNetV2
    return ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10)


def squeezenet():
    import torchvision
    return torchvision.models.squeezenet1_1(num_classes=10)


def efficientnet():
    from torchvision.models import efficientnet as E
    setting, last = E._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return E.EfficientNet(setting, 0.2, last_channel=last, num_classes=10)


def regnet():
    from torchvision.models import regnet as R
    params = R.BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8)
    return R.RegNet(params, num_classes=10, stem_width=8)


def convnext():
    from torchvision.models import convnext as C
    return C.ConvNeXt([C.CNBlockConfig(8, 16, 1), C.CNBlockConfig(16, None, 1)], num_classes=10)


def vit():
    from torchvision.models import vision_transformer as V
    return V.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                               hidden_dim=16, mlp_dim=32, num_classes=10)


def swin():
    from torchvision.models import swin_transformer as S
    return S.SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2],
                             window_size=[4, 4], num_classes=10)


class NextOps(torch.nn.Module):
    """The next families' ops: group and RMS norm, mish, logsumexp, roll,
    diff."""

    def __init__(self):
        super().__init__()
        self.gn = torch.nn.GroupNorm(2, 4)
        self.rms = torch.nn.RMSNorm(5)

    def forward(self, x):
        y = torch.nn.functional.mish(self.gn(x))
        z = self.rms(y.flatten(2)[..., :5])
        return (y.logsumexp(dim=(2, 3)), torch.roll(y, shifts=(1, -2), dims=(2, 3)),
                torch.roll(z, 3), z.diff(dim=-1), x.diff(n=2, dim=2, prepend=x[:, :, :1]))


class Decoder(torch.nn.Module):
    """The decoder side of segmentation and generative models: transposed
    convolutions (stride, padding, output padding, groups, dilation),
    nearest and bilinear upsampling."""

    def __init__(self):
        super().__init__()
        self.up1 = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.up2 = torch.nn.ConvTranspose2d(6, 4, (2, 3), stride=(1, 2), groups=2, dilation=(2, 1))
        self.up3 = torch.nn.ConvTranspose1d(4, 2, 4, stride=3, padding=2)

    def forward(self, x):
        y = torch.relu(self.up1(x))
        y = self.up2(y)
        a = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        b = torch.nn.functional.interpolate(y, size=(7, 9), mode="bilinear", align_corners=False)
        c = torch.nn.functional.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=True)
        d = torch.nn.functional.interpolate(x, size=(5, 3), mode="nearest")
        e = self.up3(y.flatten(2)[..., :9])
        return a, b, c, d, e


def tiny_resnet():
    """torchvision's BasicBlock and Bottleneck at small widths (ResNet
    itself fixes 64..512 channels: 45 MB of weights)."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    def down(i, o, s):
        return torch.nn.Sequential(torch.nn.Conv2d(i, o, 1, stride=s, bias=False),
                                   torch.nn.BatchNorm2d(o))

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(inplace=True),
        torch.nn.MaxPool2d(3, stride=2, padding=1),
        BasicBlock(8, 8),
        BasicBlock(8, 16, stride=2, downsample=down(8, 16, 2)),
        Bottleneck(16, 8, stride=2, downsample=down(16, 32, 2)),
        torch.nn.AdaptiveAvgPool2d((1, 1)),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def hf(kind):
    """A transformers model at a tiny size (random weights, no download)."""
    import transformers as t
    small = dict(vocab_size=96, max_position_embeddings=32)
    if kind == "bert":
        cfg = t.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, **small)
        return t.BertModel(cfg)
    if kind == "roberta":
        cfg = t.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, pad_token_id=1, **small)
        return t.RobertaModel(cfg)
    if kind == "distilbert":
        cfg = t.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **small)
        return t.DistilBertModel(cfg)
    if kind == "gpt2":
        cfg = t.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                           use_cache=False)
        return t.GPT2Model(cfg)
    if kind == "llama":
        cfg = t.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, use_cache=False, **small)
        return t.LlamaModel(cfg)
    if kind == "qwen2":
        cfg = t.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, use_cache=False, **small)
        return t.Qwen2Model(cfg)
    if kind == "t5":
        cfg = t.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        return t.T5EncoderModel(cfg)
    if kind == "clip":
        cfg = t.CLIPTextConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4,
                               max_position_embeddings=32, bos_token_id=0, eos_token_id=1,
                               pad_token_id=1)
        return t.CLIPTextModel(cfg)
    raise ValueError(kind)


def tokens(with_mask, batch=2):
    ids = torch.randint(2, 96, (batch, 8))
    if not with_mask:
        return (ids,)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return (ids, mask)


def image(n=1, c=3, h=32, w=32):
    return (torch.randn(n, c, h, w),)


MODELS = {
    "small_cnn_cache": (SmallCnnCache, lambda: (torch.randn(2, 3, 8, 8), torch.tensor([3, 1]))),
    "conv_zoo": (ConvZoo, lambda: (torch.randn(2, 4, 15, 13),)),
    "kv_cache": (KvCache, lambda: (torch.randn(1, 2, 16), torch.tensor([5, 6]))),
    "views_in_place": (ViewsInPlace, lambda: (torch.randn(3, 3),)),
    "mobilenet_v2": (mobilenet_v2, lambda: image(1, 3, 32, 32)),
    "mobilenet_v3_small": (mobilenet_v3_small, lambda: image(1, 3, 32, 32)),
    "shufflenet_v2": (shufflenet, lambda: image(1, 3, 32, 32)),
    "squeezenet": (squeezenet, lambda: image(1, 3, 48, 48)),
    "tiny_resnet": (tiny_resnet, lambda: image(2, 3, 32, 32)),
    "efficientnet": (efficientnet, lambda: image(1, 3, 32, 32)),
    "regnet": (regnet, lambda: image(1, 3, 32, 32)),
    "convnext": (convnext, lambda: image(1, 3, 32, 32)),
    "vit": (vit, lambda: image(2, 3, 32, 32)),
    "swin": (swin, lambda: image(1, 3, 32, 32)),
    "next_ops": (NextOps, lambda: (torch.randn(2, 4, 6, 5),)),
    "aliases_and_views": (AliasesAndViews, lambda: (torch.randn(3, 4, 2, 5), torch.tensor([0, 3, 1]))),
    "importer_defects": (ImporterDefects, lambda: (
        torch.randn(1, 4, 3, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8),
        torch.tensor([[[[True, False, True, False, True], [False] * 5, [True] * 5]]]),
        torch.randn(4, 3), torch.randn(2, 3, 4, 4))),
    "core_ops_decomposed": (CoreOps, lambda: (torch.randn(4, 8), torch.randn(4, 8)),
                            {"train": True, "decompose": True}),
    "decoder": (Decoder, lambda: (torch.randn(1, 4, 5, 4),)),
    "bert": (lambda: hf("bert"), lambda: tokens(True)),
    "roberta": (lambda: hf("roberta"), lambda: tokens(True)),
    "distilbert": (lambda: hf("distilbert"), lambda: tokens(True)),
    # Batch 1: GPT-2's Conv1D views an attention output that this
    # transformers leaves non-contiguous at batch 2 (export refuses).
    "gpt2": (lambda: hf("gpt2"), lambda: tokens(False, batch=1)),
    "llama": (lambda: hf("llama"), lambda: tokens(False)),
    "qwen2": (lambda: hf("qwen2"), lambda: tokens(False)),
    "t5_encoder": (lambda: hf("t5"), lambda: tokens(True)),
    "clip_text": (lambda: hf("clip"), lambda: tokens(False)),
}


class UnknownOp(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return y.lgamma()


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))


class TensorSplitByTensor(torch.nn.Module):
    def forward(self, x):
        return torch.tensor_split(x, torch.tensor([1, 3]), dim=1)


class NonZero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


class Plain(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


class Double(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2).double()

    def forward(self, x):
        return self.lin(x)


# Archives Kiln must refuse, and what the error must say (each line of
# NAME.expect, case-sensitive).
REFUSED = {
    "unknown_op": (UnknownOp, lambda: (torch.randn(3, 2),), {},
                   ["aten.lgamma.default", "node `lgamma`", "make_import_fixtures.py",
                    "y.lgamma()"]),
    "dynamic_batch": (Plain, lambda: (torch.randn(4, 3),),
                      {"dynamic_shapes": {"x": {0: torch.export.Dim("batch", min=2, max=64)}}},
                      ["input `x`", "dimension 0", "static shapes"]),
    "cond": (Cond, lambda: (torch.randn(3),), {}, ["higher-order op `cond`"]),
    "tensor_split_by_tensor": (TensorSplitByTensor, lambda: (torch.randn(2, 5),), {},
                               ["aten.tensor_split.tensor_indices_or_sections", "symbolic",
                                "Python ints"]),
    "nonzero": (NonZero, lambda: (torch.randn(3, 4),), {},
                ["aten.nonzero.default", "node `nonzero`", "depends on the values"]),
    "float64_weights": (Double, lambda: (torch.randn(4, 3, dtype=torch.float64),), {},
                        ["tensor `lin.bias`", "float64", "model.float()"]),
}


class Conv64(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


# Measured by the report bench only (benches/report.rs, section 9).
BENCH = {"conv2d_64x56": (Conv64, lambda: (torch.randn(1, 64, 56, 56),))}


def make_refused(name):
    ctor, args_fn, kwargs, expect = REFUSED[name]
    torch.manual_seed(0)
    ep = torch.export.export(ctor().eval(), args_fn(), **kwargs)
    pt2 = io.BytesIO()
    torch.export.save(ep, pt2)
    return pt2.getvalue(), "\n".join(expect) + "\n"


def randomize(model, seed):
    """Random weights, and batch-norm statistics that are not the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


def flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    out = []
    for v in (x.values() if isinstance(x, dict) else x):
        out.extend(flatten(v))
    return out


def make(name):
    ctor, args_fn, *opts = MODELS[name]
    opts = opts[0] if opts else {}
    torch.manual_seed(0)
    model = ctor().train(opts.get("train", False))
    randomize(model, 1)
    args = args_fn()
    ep = torch.export.export(copy.deepcopy(model), tuple(a.clone() for a in args))
    if opts.get("decompose"):
        # The core ATen IR many tools save.
        ep = ep.run_decompositions()
    sig = ep.run_decompositions().graph_signature
    user_names = [s.arg.name for s in ep.graph_signature.input_specs
                  if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    pt2 = io.BytesIO()
    torch.export.save(ep, pt2)
    # Eager, on its own copies.
    eager = copy.deepcopy(model)
    run_args = tuple(a.clone() for a in args)
    with torch.no_grad():
        outs = flatten(eager(*run_args))
    expected = {f"output.{i}": o.detach().contiguous() for i, o in enumerate(outs)}
    state = dict(eager.named_buffers())
    for fqn in sig.buffers_to_mutate.values():
        expected[fqn] = state[fqn].detach().contiguous()
    # `kiln run` writes the inputs the program mutates, not the others.
    mutated_users = set(sig.user_inputs_to_mutate.values())
    for n, a in zip(user_names, run_args):
        if n in mutated_users:
            expected[n] = a.contiguous()
    inputs = {n: a.contiguous() for n, a in zip(user_names, args)}
    return pt2.getvalue(), inputs, expected


def archive_contents(data):
    z = zipfile.ZipFile(io.BytesIO(data))
    return {i.filename.split("/", 1)[-1]: z.read(i.filename) for i in z.infolist()
            if ".data/serialization_id" not in i.filename and "sample_inputs" not in i.filename}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    bad = []
    for name in MODELS:
        if a.only and name != a.only:
            continue
        pt2, inputs, expected = make(name)
        base = os.path.join(OUT, name)
        if a.check:
            old = open(base + ".pt2", "rb").read()
            if archive_contents(old) != archive_contents(pt2):
                bad.append(name + ".pt2")
            for suffix, d in ((".inputs.safetensors", inputs), (".expected.safetensors", expected)):
                have = load_file(base + suffix)
                if have.keys() != d.keys() or any(not torch.equal(have[k], d[k]) for k in d):
                    bad.append(name + suffix)
            continue
        open(base + ".pt2", "wb").write(pt2)
        save_file(inputs, base + ".inputs.safetensors")
        save_file(expected, base + ".expected.safetensors")
        size = sum(os.path.getsize(base + s) for s in (".pt2", ".inputs.safetensors", ".expected.safetensors"))
        print(f"{name}: {size / 1024:.0f} KiB, outputs {sorted(expected)}")
    os.makedirs(os.path.join(OUT, "bench"), exist_ok=True)
    for name in BENCH:
        if a.only and name != a.only or a.check:
            continue
        torch.manual_seed(0)
        ctor, args_fn = BENCH[name]
        args = args_fn()
        ep = torch.export.export(ctor().eval(), args)
        ep._example_inputs = None  # the bench makes its own inputs
        base = os.path.join(OUT, "bench", name)
        torch.export.save(ep, base + ".pt2")
        print(f"bench/{name}")
    # One small model saved under names of every length from 1 to 40:
    # PyTorch names the archive's folder after the file, so the name's
    # length moves every offset (an 8-character name once broke the zip
    # reader: resnet18.pt2).
    os.makedirs(os.path.join(OUT, "names"), exist_ok=True)
    if not a.only and not a.check:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).eval()
        x = torch.randn(1, 3)
        ep = torch.export.export(model, (x,))
        ep._example_inputs = None
        for n in range(1, 41):
            torch.export.save(ep, os.path.join(OUT, "names", "n" * n + ".pt2"))
        with torch.no_grad():
            save_file({"input": x}, os.path.join(OUT, "names", "inputs.safetensors"))
            save_file({"output.0": model(x)}, os.path.join(OUT, "names", "expected.safetensors"))
        print("names/: 40 archives")
    os.makedirs(os.path.join(OUT, "refused"), exist_ok=True)
    for name in REFUSED:
        if a.only and name != a.only:
            continue
        pt2, expect = make_refused(name)
        base = os.path.join(OUT, "refused", name)
        if a.check:
            if archive_contents(open(base + ".pt2", "rb").read()) != archive_contents(pt2):
                bad.append("refused/" + name + ".pt2")
            continue
        open(base + ".pt2", "wb").write(pt2)
        open(base + ".expect", "w").write(expect)
        print(f"refused/{name}: {len(pt2) / 1024:.0f} KiB")
    if bad:
        print("differ from the committed fixtures:", ", ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
