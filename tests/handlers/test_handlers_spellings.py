"""The jit spelling and the dispatch spelling of one computation cost the same, and the
default registry builds and covers the common ops. OpCalls are hand-built with the
arguments each tracer records (checked against the aten schemas)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flopcount.core.registry import KNOWN_ZERO, HandlerRegistry
from flopcount.errors import DuplicateHandlerError
from flopcount.handlers import FAMILIES, build_default_registry
from flopcount.types import Cost, OpCall, TensorMeta

REG = build_default_registry()
SETTINGS = settings(max_examples=30, deadline=None)


def T(*shape, dtype="float32"):
    return TensorMeta(tuple(shape), dtype)


def cost(op, outputs=(), **args):
    resolved = REG.resolve(op)
    if resolved == KNOWN_ZERO:
        return Cost()
    return resolved(OpCall(op, args, tuple(outputs)))


@SETTINGS
@given(b=st.integers(1, 3), t=st.integers(1, 5), fin=st.integers(1, 8), fout=st.integers(1, 8), bias=st.booleans())
def test_linear_equals_addmm_or_mm(b, t, fin, fout, bias):
    jit = cost("aten::linear", outputs=(T(b, t, fout),), input=T(b, t, fin), weight=T(fout, fin), bias=T(fout) if bias else None)
    if bias:
        leaf = cost("aten::addmm", outputs=(T(b * t, fout),), self=T(fout), mat1=T(b * t, fin), mat2=T(fin, fout), beta=1, alpha=1)
    else:
        leaf = cost("aten::mm", outputs=(T(b * t, fout),), self=T(b * t, fin), mat2=T(fin, fout))
    leaf += cost("aten::t", self=T(fout, fin)) + cost("aten::view", self=T(b, t, fin), size=(b * t, fin))
    assert jit == leaf


@SETTINGS
@given(rows=st.integers(1, 6), width=st.integers(1, 9), affine=st.booleans())
def test_layer_norm_equals_native(rows, width, affine):
    w = T(width) if affine else None
    args = dict(input=T(rows, 2, width), normalized_shape=(width,), weight=w, bias=w)
    assert cost("aten::layer_norm", eps=1e-5, cudnn_enable=True, **args) == cost("aten::native_layer_norm", eps=1e-5, **args)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_train_and_eval_equal_native_variants(affine):
    x, c = T(4, 3, 5, 5), 3
    w = T(c) if affine else None
    stats = dict(running_mean=T(c), running_var=T(c))
    train_jit = cost("aten::batch_norm", input=x, weight=w, bias=w, training=True, momentum=0.1, eps=1e-5, cudnn_enabled=True, **stats)
    eval_jit = cost("aten::batch_norm", input=x, weight=w, bias=w, training=False, momentum=0.1, eps=1e-5, cudnn_enabled=True, **stats)
    assert train_jit != eval_jit
    for op in ("aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional"):
        assert cost(op, input=x, weight=w, bias=w, training=True, momentum=0.1, eps=1e-5, **stats) == train_jit
        assert cost(op, input=x, weight=w, bias=w, training=False, momentum=0.1, eps=1e-5, **stats) == eval_jit
    # the no_stats overload of _native_batch_norm_legit has no running statistics
    assert cost("aten::_native_batch_norm_legit", input=x, weight=w, bias=w, training=True, momentum=0.1, eps=1e-5) == train_jit
    assert cost("aten::_native_batch_norm_legit_no_training", input=x, weight=w, bias=w, momentum=0.1, eps=1e-5, **stats) == eval_jit
    assert cost("aten::_batch_norm_with_update", input=x, weight=w, bias=w, momentum=0.1, eps=1e-5, **stats) == train_jit
    assert cost("aten::_batch_norm_no_update", input=x, weight=w, bias=w, momentum=0.1, eps=1e-5, **stats) == eval_jit


def test_instance_and_group_norm_equal_their_dispatch_forms():
    x = T(2, 4, 3, 3)
    jit = cost("aten::instance_norm", input=x, weight=T(4), bias=T(4), running_mean=None, running_var=None, use_input_stats=True, momentum=0.1, eps=1e-5, cudnn_enabled=True)
    # dispatch: batch norm in training mode on (1, N*C, ...) with the affine repeated N times
    leaf = cost("aten::native_batch_norm", input=T(1, 8, 3, 3), weight=T(8), bias=T(8), running_mean=None, running_var=None, training=True, momentum=0.1, eps=1e-5)
    leaf += cost("aten::repeat", self=T(4), repeats=(2,)) + cost("aten::view", self=x, size=(1, 8, 3, 3))
    assert jit == leaf
    jit = cost("aten::group_norm", input=x, num_groups=2, weight=T(4), bias=T(4), eps=1e-5, cudnn_enabled=True)
    leaf = cost("aten::native_group_norm", input=x, weight=T(4), bias=T(4), N=2, C=4, HxW=9, group=2, eps=1e-5)
    assert jit == leaf


@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm_equals_its_decomposition(weight):
    x, rows = T(2, 3, 8), T(2, 3, 1)
    jit = cost("aten::rms_norm", outputs=(x,), input=x, normalized_shape=(8,), weight=T(8) if weight else None, eps=None)
    # what the dispatch tracer records for F.rms_norm on CPU
    leaf = (
        cost("aten::pow", outputs=(x,), self=x, exponent=2)
        + cost("aten::mean", outputs=(rows,), self=x, dim=(2,), keepdim=True, dtype=None)
        + cost("aten::add_", outputs=(rows,), self=rows, other=1.19e-07, alpha=1)
        + cost("aten::rsqrt", outputs=(rows,), self=rows)
        + cost("aten::mul", outputs=(x,), self=x, other=rows)
    )
    if weight:
        leaf += cost("aten::mul", outputs=(x,), self=x, other=T(8))
    assert jit == leaf


def test_softmax_spellings():
    x = T(4, 3, 7)
    assert cost("aten::softmax", self=x, dim=-1, dtype=None) == cost("aten::_softmax", self=x, dim=-1, half_to_float=False)
    assert cost("aten::softmax", self=x, dim=-1, dtype=None) == cost("aten::_safe_softmax", self=x, dim=-1, dtype=None)
    assert cost("aten::log_softmax", self=x, dim=-1, dtype=None) == cost("aten::_log_softmax", self=x, dim=-1, half_to_float=False)


def test_cross_entropy_equals_log_softmax_plus_nll():
    logits, target = T(6, 10), T(6, dtype="int64")
    jit = cost("aten::cross_entropy_loss", self=logits, target=target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0)
    leaf = cost("aten::_log_softmax", self=logits, dim=1, half_to_float=False) + cost(
        "aten::nll_loss_forward", self=logits, target=target, weight=None, reduction=1, ignore_index=-100
    )
    assert jit == leaf


def test_dropout_equals_its_decomposition_and_native_dropout():
    x = T(2, 3, 4)
    jit = cost("aten::dropout", input=x, p=0.1, train=True)
    # CPU decomposition: empty_like, bernoulli_, div_ (mask scale), mul
    leaf = (
        cost("aten::empty_like", self=x)
        + cost("aten::bernoulli_", self=x, p=0.9, generator=None)
        + cost("aten::div_", outputs=(x,), self=x, other=0.9)
        + cost("aten::mul", outputs=(x,), self=x, other=x)
    )
    assert jit == leaf == cost("aten::native_dropout", input=x, p=0.1, train=True)


@SETTINGS
@given(b=st.integers(1, 3), h=st.integers(1, 4), lq=st.integers(1, 8), lk=st.integers(1, 8), e=st.integers(1, 8))
def test_sdpa_composite_equals_fused_kernels(b, h, lq, lk, e):
    q, k, v = T(b, h, lq, e), T(b, h, lk, e), T(b, h, lk, e)
    composite = cost("aten::scaled_dot_product_attention", query=q, key=k, value=v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    for op in (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    ):
        assert cost(op, outputs=(q, T(b, h, lq)), query=q, key=k, value=v, dropout_p=0.0, is_causal=True) == composite
    bshd = dict(query=T(b, lq, h, e), key=T(b, lk, h, e), value=T(b, lk, h, e))
    assert cost("aten::_flash_attention_forward", cum_seq_q=None, cum_seq_k=None, max_q=lq, max_k=lk, **bshd) == composite
    assert cost("aten::_efficient_attention_forward", bias=None, cu_seqlens_q=None, cu_seqlens_k=None, **bshd) == composite


def test_conv_spellings_agree():
    x, w, out = T(2, 4, 9, 9), T(6, 2, 3, 3), T(2, 6, 4, 4)
    common = dict(input=x, weight=w, bias=T(6), stride=(2, 2), padding=(0, 0), dilation=(1, 1), groups=2)
    a = cost("aten::conv2d", outputs=(out,), **common)
    b = cost("aten::convolution", outputs=(out,), transposed=False, output_padding=(0, 0), **common)
    c = cost("aten::_convolution", outputs=(out,), transposed=False, output_padding=(0, 0), benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True, **common)
    assert a == b == c


def test_pooling_spellings_agree():
    x, out = T(2, 3, 8, 8), T(2, 3, 4, 4)
    args = dict(self=x, kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1), ceil_mode=False)
    assert cost("aten::max_pool2d", outputs=(out,), **args) == cost("aten::max_pool2d_with_indices", outputs=(out, out), **args)
    pooled = T(2, 3, 1, 1)
    adaptive = cost("aten::adaptive_avg_pool2d", outputs=(pooled,), self=x, output_size=(1, 1))
    assert adaptive == cost("aten::_adaptive_avg_pool2d", outputs=(pooled,), self=x, output_size=(1, 1))
    # a global average pool costs what the mean over the same dims costs
    assert adaptive == cost("aten::mean", outputs=(pooled,), self=x, dim=(2, 3), keepdim=True, dtype=None)


def test_lstm_equals_mkldnn_layers():
    # 1-layer bidirectional LSTM: jit's aten::lstm vs two aten::mkldnn_rnn_layer calls
    w_ih, w_hh, b = T(64, 8), T(64, 16), T(64)
    params = (w_ih, w_hh, b, b) * 2
    x = T(5, 2, 8)
    jit = cost("aten::lstm", input=x, hx=(T(2, 2, 16),) * 2, params=params, has_biases=True, num_layers=1, dropout=0.0, train=False, bidirectional=True, batch_first=False)
    layer = dict(input=x, weight0=w_ih, weight1=w_hh, weight2=b, weight3=b, hx_=T(2, 16), cx_=T(2, 16), batch_sizes=(), mode=2, hidden_size=16, num_layers=1, has_biases=True, bidirectional=True, batch_first=False, train=False)
    leaf = cost("aten::mkldnn_rnn_layer", reverse=False, **layer) + cost("aten::mkldnn_rnn_layer", reverse=True, **layer)
    assert jit == leaf


def test_rnn_tanh_equals_its_cell_decomposition():
    # nn.RNN on CPU: one input projection (addmm over all steps) + per step addmm, add_, tanh
    steps, batch, hin, hid = 3, 2, 8, 16
    jit = cost("aten::rnn_tanh", input=T(steps, batch, hin), hx=T(1, batch, hid), params=(T(hid, hin), T(hid, hid), T(hid), T(hid)), has_biases=True, num_layers=1, dropout=0.0, train=False, bidirectional=False, batch_first=False)
    h = T(batch, hid)
    leaf = cost("aten::addmm", self=T(hid), mat1=T(steps * batch, hin), mat2=T(hin, hid))
    for _ in range(steps):
        leaf += cost("aten::addmm", self=T(hid), mat1=h, mat2=T(hid, hid))
        leaf += cost("aten::add_", outputs=(h,), self=h, other=h, alpha=1) + cost("aten::tanh", outputs=(h,), self=h)
    assert jit == leaf


# -- the registry ------------------------------------------------------------------------------------

COMMON_OPS = """
aten::linear aten::addmm aten::mm aten::bmm aten::baddbmm aten::matmul aten::einsum aten::mv aten::dot
aten::_convolution aten::convolution aten::conv2d aten::conv_transpose2d aten::convolution_backward
aten::scaled_dot_product_attention aten::_scaled_dot_product_flash_attention_for_cpu
aten::_scaled_dot_product_flash_attention_for_cpu_backward aten::layer_norm aten::native_layer_norm
aten::native_layer_norm_backward aten::batch_norm aten::native_batch_norm aten::native_batch_norm_backward
aten::group_norm aten::native_group_norm aten::rms_norm aten::softmax aten::_softmax aten::_softmax_backward_data
aten::log_softmax aten::_log_softmax aten::add aten::add_ aten::sub aten::mul aten::div aten::neg aten::pow
aten::rsqrt aten::exp aten::cos aten::sin aten::tanh aten::relu aten::relu_ aten::gelu aten::silu aten::sigmoid
aten::hardtanh_ aten::threshold_backward aten::gelu_backward aten::silu_backward aten::where aten::masked_fill
aten::eq aten::max_pool2d aten::max_pool2d_with_indices aten::max_pool2d_with_indices_backward
aten::adaptive_avg_pool2d aten::_adaptive_avg_pool2d aten::_adaptive_avg_pool2d_backward aten::avg_pool2d
aten::upsample_nearest2d aten::upsample_bilinear2d aten::dropout aten::native_dropout aten::sum aten::mean
aten::var aten::std aten::norm aten::linalg_vector_norm aten::cumsum aten::embedding aten::embedding_dense_backward
aten::embedding_bag aten::cross_entropy_loss aten::nll_loss_forward aten::mse_loss aten::lstm aten::gru
aten::view aten::reshape aten::permute aten::transpose aten::t aten::expand aten::contiguous aten::clone
aten::_to_copy aten::to aten::detach aten::cat aten::stack aten::slice aten::select aten::split aten::chunk
aten::unsqueeze aten::squeeze aten::flatten aten::_unsafe_view aten::zeros aten::ones aten::arange aten::full_like
aten::size aten::Int aten::ScalarImplicit prim::NumToTensor aten::bernoulli_ aten::copy_ aten::fill_
""".split()


def test_registry_builds_and_resolves_common_ops():
    registry = build_default_registry()
    missing = [op for op in COMMON_OPS if registry.resolve(op) is None]
    assert not missing, missing
    listing = registry.ops()
    assert sum(v == "handler" for v in listing.values()) > 200
    assert sum(v == "zero" for v in listing.values()) > 150


def test_families_register_each_op_once():
    # registering every family into one registry raises on any duplicate; doing it twice must raise
    registry = HandlerRegistry()
    for family in FAMILIES:
        family.register(registry)
    with pytest.raises(DuplicateHandlerError):
        FAMILIES[0].register(registry)


def test_arithmetic_ops_are_not_known_zero():
    for op in ("aten::add", "aten::mul", "aten::sum", "aten::softmax", "aten::scatter_add", "aten::col2im", "aten::index_add"):
        assert REG.resolve(op) not in (None, KNOWN_ZERO), op
