"""The torch contract of BayesianMultiheadAttention inside torch's own layers, and the blocks'
torch signature. Every check compares with torch itself."""

from __future__ import annotations

import inspect

import pyro
import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import BayesianMultiheadAttention as BMHA
from bayesattn import DecoderLayer, EncoderLayer, attention_mode
from bayesattn.priors import DistanceDecayPrior

E, H = 16, 4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.clear_param_store()


def _twin(batch_first=True, **kw):
    ref = nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours = BMHA(E, H, batch_first=batch_first, **kw).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _swap_attention(model: nn.Module, **kw) -> nn.Module:
    """Replace every nn.MultiheadAttention by ours by hand (independent of bayesattn.convert)."""
    for name, m in list(model.named_modules()):
        if type(m) is nn.MultiheadAttention:
            new = BMHA(m.embed_dim, m.num_heads, m.dropout, batch_first=m.batch_first, **kw)
            new.load_state_dict(m.state_dict())
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], new)
    return model


def test_merge_masks_matches_torch():
    ref, ours = _twin()
    x = torch.randn(3, 5, E)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[1, 3:] = True
    am2 = torch.randn(5, 5)
    am3 = torch.randn(3 * H, 5, 5)
    for am, kp in [(None, None), (None, kpm), (am2, None), (am3, None), (am2, kpm), (am3, kpm)]:
        a, b = ours.merge_masks(am, kp, x), ref.merge_masks(am, kp, x)
        assert a[1] == b[1]
        if b[0] is None:
            assert a[0] is None
        else:
            torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_inside_torch_encoder_layer_on_and_off_the_fast_path(norm_first):
    ref = nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True, norm_first=norm_first)
    ours = _swap_attention(
        nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True, norm_first=norm_first)
    )
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    x = torch.randn(3, 6, E)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    cm = nn.Transformer.generate_square_subsequent_mask(6)
    for kw in [{}, dict(src_key_padding_mask=kpm), dict(src_mask=cm), dict(src_mask=cm, src_key_padding_mask=kpm)]:  # fmt: skip
        with torch.no_grad():  # fast path (merge_masks)
            torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)  # slow path


def test_bayesian_layer_keeps_torch_layer_off_its_fast_path():
    layer = _swap_attention(nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True)).eval()
    attn = layer.self_attn
    assert attn._qkv_same_embed_dim  # plain: torch's fast path allowed
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        det = layer(x)
        attn.family = "dirichlet" and __import__("bayesattn").DirichletWeights(num_heads=H)
        # eval() without a mode: the posterior mean, torch's computation exactly: fast path on
        assert attn._qkv_same_embed_dim
        torch.testing.assert_close(layer(x), det, atol=1e-5, rtol=0)
        with attention_mode("guide"):
            assert not attn._qkv_same_embed_dim  # draws weights: fast path off
            assert (layer(x) - det).abs().max() > 1e-3  # sampled: our forward ran
        with bayesattn.num_samples(2):
            assert not attn._qkv_same_embed_dim  # draws asked for: fast path off
        layer.train()
        assert not attn._qkv_same_embed_dim  # training mode draws
        layer.eval()
        attn.family = None
        assert attn._qkv_same_embed_dim
        attn.prior = DistanceDecayPrior(H)  # a prior torch's kernel cannot compute
        assert not attn._qkv_same_embed_dim
        assert (layer(x) - det).abs().max() > 1e-4
    assert not attn._forward_pre_hooks  # no hook attached: users' hooks are torch's business


def test_bayesian_layer_in_mean_mode_keeps_torchs_fast_path():
    """In "mean" mode a Bayesian layer computes exactly torch's attention, so torch's encoder
    layer keeps its fused fast path (our forward is not called) in eval under no_grad, with and
    without padding; in "guide" mode, with a prior, recording weights, or with a user's hook,
    our forward runs."""
    layer = _swap_attention(
        nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True), family="dirichlet"
    ).eval()
    attn = layer.self_attn
    calls = []
    orig = type(attn).forward

    def spy(self, *a, **k):
        calls.append(1)
        return orig(self, *a, **k)

    x = torch.randn(2, 5, E)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        with attention_mode("mean"):
            want = [layer(x), layer(x, src_key_padding_mask=kpm)]
        type(attn).forward = spy
        try:
            with attention_mode("mean"):
                torch.testing.assert_close(layer(x), want[0], atol=0, rtol=0)
                layer(x, src_key_padding_mask=kpm)
                assert calls == []  # fused path both times
                attn.record_weights = True
                torch.testing.assert_close(layer(x), want[0], atol=1e-5, rtol=0)
                assert len(calls) == 1
                attn.record_weights = False
                h = attn.register_forward_pre_hook(lambda m, a: None)
                layer(x)
                assert len(calls) == 2  # a user's hook must run: torch's rule
                h.remove()
                layer(x)
                assert len(calls) == 2
            layer(x)  # eval() without a mode is "mean" too: the fused path
            assert len(calls) == 2
            with attention_mode("guide"):
                layer(x)  # drawn weights need our forward
            assert len(calls) == 3
        finally:
            type(attn).forward = orig
        ref = nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True).eval()
        ref.load_state_dict(layer.state_dict(), strict=False)
        torch.testing.assert_close(ref(x, src_key_padding_mask=kpm), want[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", [None, "dirichlet"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_nn_transformer_eval_no_grad(batch_first, family):
    ref = nn.Transformer(E, H, 2, 2, 32, 0.0, batch_first=batch_first).eval()
    ours = nn.Transformer(E, H, 2, 2, 32, 0.0, batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    _swap_attention(ours, family=family).eval()
    B, S, T = 3, 7, 5
    src = torch.randn(B, S, E) if batch_first else torch.randn(S, B, E)
    tgt = torch.randn(B, T, E) if batch_first else torch.randn(T, B, E)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, 5:] = True  # left-aligned padding: torch's encoder turns src into a NestedTensor
    tm = nn.Transformer.generate_square_subsequent_mask(T)
    kw = dict(tgt_mask=tm, tgt_is_causal=True, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    with torch.no_grad(), attention_mode("mean"):
        out, want = ours(src, tgt, **kw), ref(src, tgt, **kw)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(src, tgt), ref(src, tgt), atol=1e-5, rtol=0)


def test_nested_tensor_inputs_match_torch_fast_path():
    ref, ours = _twin(family="dirichlet")
    nt = torch.nested.nested_tensor([torch.randn(3, E), torch.randn(5, E)])
    with torch.no_grad():
        want = ref(nt, nt, nt, need_weights=False)[0]
        with attention_mode("mean"):
            got = ours(nt, nt, nt, need_weights=False)[0]
        assert got.is_nested
        for a, b in zip(got.unbind(), want.unbind(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        sampled = ours(nt, nt, nt, need_weights=False)[0]
    assert [t.shape for t in sampled.unbind()] == [t.shape for t in want.unbind()]
    with pytest.raises(ValueError, match="NestedTensor"):
        ours(nt, nt, nt, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_first"):
        BMHA(E, H)(nt, nt, nt)


def test_is_causal_rules_are_torchs():
    ref, ours = _twin()
    ref.train(), ours.train()  # torch's slow path applies the rules (dropout is 0)
    x = torch.randn(2, 5, E)
    not_causal = torch.zeros(5, 5, dtype=torch.bool)
    not_causal[0, 1] = True  # deliberately not a causal mask
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1, 4] = True
    for m in (ref, ours):
        with pytest.raises(RuntimeError, match="Need attn_mask"):
            m(x, x, x, is_causal=True)
    cases = [
        dict(attn_mask=not_causal, is_causal=True, need_weights=False),  # hint wins
        dict(attn_mask=not_causal, is_causal=True, need_weights=True),  # mask wins
        dict(attn_mask=not_causal, is_causal=True, key_padding_mask=kpm, need_weights=False),
    ]
    for kw in cases:
        torch.testing.assert_close(ours(x, x, x, **kw)[0], ref(x, x, x, **kw)[0], atol=1e-5, rtol=0)


def test_dtype_rules_follow_torch():
    ref, ours = _twin()
    ref.double(), ours.double()
    for m in (ref, ours):
        m.in_proj_bias.data = m.in_proj_bias.data.half()  # torch's fused kernel casts it
    x = torch.randn(2, 4, E, dtype=torch.double)
    with torch.no_grad():
        want = ref(x, x, x, need_weights=False)[0]
        got = ours(x, x, x, need_weights=False)[0]
    assert got.dtype == torch.double
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)  # the bias was rounded to half
    for m in (ref, ours):
        m.out_proj.bias.data = m.out_proj.bias.data.half()  # torch refuses this one
        with pytest.raises(RuntimeError, match="dtype"):
            m(x, x, x)
    ref, ours = _twin()
    for m in (ref, ours):  # float input to double weights: both refuse
        with pytest.raises(RuntimeError, match="dtype"):
            m.double()(x.float(), x.float(), x.float())


def test_torchscript_scripts_the_mean_layer():
    ref, ours = _twin(family="dirichlet")
    x = torch.randn(2, 5, E)
    scripted = torch.jit.script(ours)
    torch.testing.assert_close(scripted(x, x, x)[0], ref(x, x, x)[0], atol=1e-6, rtol=0)
    layer = nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True).eval()
    want = layer(x)
    _swap_attention(layer, family="dirichlet")
    torch.testing.assert_close(torch.jit.script(layer)(x), want, atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="UniformPrior"):
        torch.jit.script(BMHA(E, H, prior=DistanceDecayPrior(H)))


class _Wrap(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x, x, x, need_weights=False)[0]


def test_compile_fullgraph_and_export_in_mean_mode_with_validation_on():
    ref, ours = _twin(family="dirichlet")
    x = torch.randn(2, 5, E)
    want = ref(x, x, x)[0]
    with pyro.validation_enabled(True), attention_mode("mean"):
        torch._dynamo.reset()
        compiled = torch.compile(_Wrap(ours), fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=0)
        ep = torch.export.export(_Wrap(ours), (x,))
        torch.testing.assert_close(ep.module()(x), want, atol=1e-5, rtol=0)
        bad = x.clone()
        bad[0, 0, 0] = float("nan")
        with pytest.raises(RuntimeError, match="finite"):  # validation lives in the graph
            ep.module()(bad)
        layer = nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True).eval()
        want = layer(x)
        _swap_attention(layer, family="dirichlet")  # inside torch's own layer
        compiled = torch.compile(layer, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=0)


class _Masked(nn.Module):
    """``m(x, x, x, **kw)[0]``: the masks and torch's default ``need_weights=True`` go in."""

    def __init__(self, m: nn.Module, **kw) -> None:
        super().__init__()
        self.m, self.kw = m, kw

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.m(x, x, x, **{self.kw["as"]: mask})[0]


class _Padded(nn.Module):
    def __init__(self, enc: nn.Module) -> None:
        super().__init__()
        self.enc = enc

    def forward(self, x: torch.Tensor, kpm: torch.Tensor) -> torch.Tensor:
        return self.enc(x, src_key_padding_mask=kpm)


@pytest.mark.slow  # ~10-15 s each on a loaded 2-core machine (Dynamo tracing)
@pytest.mark.parametrize("grad", [False, True])
def test_compile_fullgraph_and_export_with_float_masks_and_weights(grad):
    """Float masks (and so every padded nn.TransformerEncoder: torch turns its bool padding mask
    into a float one), torch's default need_weights=True, with and without grad: compiled
    (fullgraph) and exported as torch's own layer is, same outputs as torch; the mask checks
    live in the graph."""
    ref, ours = _twin(family="dirichlet")
    x = torch.randn(2, 5, E)
    fmask = torch.randn(5, 5).masked_fill(torch.rand(5, 5) < 0.3, float("-inf"))
    fmask.fill_diagonal_(0.0)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True), 2, enable_nested_tensor=False
    ).eval()
    want_enc = enc(x, src_key_padding_mask=kpm)
    _swap_attention(enc, family="dirichlet")
    cases = [
        (_Masked(ours, **{"as": "attn_mask"}), (x, fmask), ref(x, x, x, attn_mask=fmask)[0]),
        (_Masked(ours, **{"as": "key_padding_mask"}), (x, kpm),
         ref(x, x, x, key_padding_mask=kpm)[0]),
        (_Padded(enc), (x, kpm), want_enc),
    ]  # fmt: skip
    with pyro.validation_enabled(True), attention_mode("mean"), torch.set_grad_enabled(grad):
        for mod, args, want in cases:
            torch._dynamo.reset()
            got = torch.compile(mod, fullgraph=True, backend="eager")(*args)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
            ep = torch.export.export(mod, args)
            torch.testing.assert_close(ep.module()(*args), want, atol=1e-5, rtol=0)
        bad = fmask.clone()
        bad[0, 0] = float("nan")
        with pytest.raises(RuntimeError, match="NaN"):
            torch.export.export(cases[0][0], (x, fmask)).module()(x, bad)


_X = torch.randn(2, 5, E)
_BAD_CALLS = {
    "query last dim": lambda m: m(_X[..., :4], _X, _X),
    "key last dim": lambda m: m(_X, _X[..., :4], _X[..., :4]),
    "batch mismatch": lambda m: m(_X, _X[:1], _X[:1]),
    "key/value lengths": lambda m: m(_X, _X, _X[:, :4]),
    "key_padding_mask shape": lambda m: m(
        _X, _X, _X, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
    "attn_mask 2-D shape": lambda m: m(_X, _X, _X, attn_mask=torch.zeros(4, 5)),
    "attn_mask 3-D shape": lambda m: m(_X, _X, _X, attn_mask=torch.zeros(3, 5, 5)),
    "attn_mask 1-D": lambda m: m(_X, _X, _X, attn_mask=torch.zeros(5)),
    "attn_mask int": lambda m: m(_X, _X, _X, attn_mask=torch.zeros(5, 5, dtype=torch.int32)),
    "key_padding_mask int": lambda m: m(
        _X, _X, _X, key_padding_mask=torch.zeros(2, 5, dtype=torch.int32)),
    "query 1-D": lambda m: m(torch.randn(E), torch.randn(E), torch.randn(E)),
    "query 2-D, key 3-D": lambda m: m(_X[0], _X, _X),
    "dtype": lambda m: m(_X.double(), _X.double(), _X.double()),
    "unbatched 2-D key_padding_mask": lambda m: m(
        _X[0], _X[0], _X[0], key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)),
    "is_causal without a mask": lambda m: m(_X, _X, _X, is_causal=True),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_BAD_CALLS))
def test_errors_are_also_the_class_torch_raises(case):
    """Each bad call fails in torch and in ours; ours is also an instance of torch's error class
    (AssertionError/RuntimeError), so ``except`` clauses written for torch still work, and a
    ValueError/TypeError naming the argument."""
    ref, ours = _twin()
    with pytest.raises(Exception) as theirs:  # noqa: PT011 - any: we read its class
        _BAD_CALLS[case](ref)
    with pytest.raises(type(theirs.value)) as mine:
        _BAD_CALLS[case](ours)
    assert isinstance(mine.value, (ValueError, TypeError))


# ------------------------------------------------------------------------------------------
# blocks: torch's arguments in torch's positional order
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ours_cls, torch_cls",
    [(EncoderLayer, nn.TransformerEncoderLayer), (DecoderLayer, nn.TransformerDecoderLayer)],
)
def test_block_signatures_are_torchs(ours_cls, torch_cls):
    mine = list(inspect.signature(ours_cls.__init__).parameters.values())
    theirs = list(inspect.signature(torch_cls.__init__).parameters.values())
    positional = [p for p in mine if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [p.name for p in theirs]
    for a, b in zip(positional, theirs, strict=True):
        if a.name != "activation":  # torch's default is the function F.relu, ours "relu"
            assert a.default == b.default, a.name
    fwd_mine = list(inspect.signature(ours_cls.forward).parameters)
    assert fwd_mine == list(inspect.signature(torch_cls.forward).parameters)


# (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
# bias), passed positionally to both
_POSITIONAL = [
    (E, H, 32, 0.0, "relu", 1e-5),
    (E, H, 32, 0.0, "gelu", 1e-6, True),
    (E, H, 32, 0.0, "relu", 1e-5, False, True),
    (E, H, 32, 0.0, "gelu", 1e-5, True, True, False),
]


@pytest.mark.parametrize("args", _POSITIONAL)
def test_encoder_layer_positional_parity(args):
    ref = nn.TransformerEncoderLayer(*args).eval()
    ours = EncoderLayer(*args).eval()
    ours.load_state_dict(ref.state_dict())
    bf = len(args) > 6 and args[6]
    x = torch.randn(3, 5, E)  # (B, T, E) if batch_first else (T, B, E)
    kpm = torch.zeros(3 if bf else 5, 5 if bf else 3, dtype=torch.bool)
    kpm[0, -1] = True
    for kw in [{}, dict(src_key_padding_mask=kpm.T if not bf else kpm)]:
        if not bf:
            kw = {k: torch.zeros(3, 3, dtype=torch.bool) | v.T[:3, :3] for k, v in kw.items()}
            x = torch.randn(3, 3, E)
        torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)
        with torch.no_grad():
            torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)


@pytest.mark.parametrize("args", _POSITIONAL)
def test_decoder_layer_positional_parity(args):
    ref = nn.TransformerDecoderLayer(*args).eval()
    ours = DecoderLayer(*args).eval()
    ours.load_state_dict(ref.state_dict())
    bf = len(args) > 6 and args[6]
    tgt = torch.randn(2, 4, E) if bf else torch.randn(4, 2, E)
    mem = torch.randn(2, 6, E) if bf else torch.randn(6, 2, E)
    cm = nn.Transformer.generate_square_subsequent_mask(4)
    mkpm = torch.zeros(2, 6, dtype=torch.bool)
    mkpm[1, 4:] = True
    kw = dict(tgt_mask=cm, tgt_is_causal=True, memory_key_padding_mask=mkpm)
    torch.testing.assert_close(ours(tgt, mem, **kw), ref(tgt, mem, **kw), atol=1e-5, rtol=0)
    torch.testing.assert_close(ours(tgt, mem), ref(tgt, mem), atol=1e-5, rtol=0)


# ---- issue 33: torch's own message phrases -------------------------------------------------------
def _invalid_shape_cases(mha, fast: bool):
    """PyTorch's ``test_multihead_attn_invalid_shape`` / ``..._fast_path_invalid_shape`` cases:
    (call, torch's message)."""
    q3, q2 = torch.randn(4, 4, 4), torch.randn(4, 4)
    kw = {"need_weights": False} if fast else {}
    bad_k = torch.randn(3, 3) if fast else torch.randn(4, 4)
    m1 = torch.tensor([False, True, True] if fast else [False, False, True, True])
    return [
        (lambda: mha(q3, bad_k, q3, **kw),
         "expected `key` and `value` to be 3-D but found 2-D and 3-D tensors respectively"),
        (lambda: mha(q3, q3, bad_k, **kw),
         "expected `key` and `value` to be 3-D but found 3-D and 2-D tensors respectively"),
        (lambda: mha(q3, q3, q3, key_padding_mask=m1, **kw),
         "expected `key_padding_mask` to be `None` or 2-D but found 1-D tensor instead"),
        (lambda: mha(q3, q3, q3, attn_mask=m1, **kw),
         "expected `attn_mask` to be `None`, 2-D or 3-D but found 1-D tensor instead"),
        (lambda: mha(q2, torch.randn(4, 4, 4), q2),
         "expected `key` and `value` to be 2-D but found 3-D and 2-D tensors respectively"),
        (lambda: mha(q2, q2, torch.randn(4, 4, 4)),
         "expected `key` and `value` to be 2-D but found 2-D and 3-D tensors respectively"),
        (lambda: mha(q2, q2, q2, key_padding_mask=torch.tensor([[False, False, True, True] * 2])),
         "expected `key_padding_mask` to be `None` or 1-D but found 2-D tensor instead"),
        (lambda: mha(q2, q2, q2, attn_mask=torch.tensor([False, False, True, True])),
         "expected `attn_mask` to be `None`, 2-D or 3-D but found 1-D tensor instead"),
        (lambda: mha(q2, q2, q2, attn_mask=torch.randn(5, 4, 4).bernoulli_().to(torch.bool)),
         r"Expected `attn_mask` shape to be \(4, 4, 4\)"),
    ]  # fmt: skip


@pytest.mark.parametrize("fast", [False, True])
def test_torch_invalid_shape_messages_are_kept_in_our_errors(fast):
    """Code that matches torch's AssertionError messages keeps working; our text comes first."""
    mha = BMHA(4, 4, batch_first=fast).eval()
    for call, msg in _invalid_shape_cases(mha, fast):
        with torch.no_grad(), pytest.raises(AssertionError, match=msg) as err:
            call()
        assert isinstance(err.value, ValueError) and str(err.value).index(msg[:8]) > 0
