"""Bytes per op family (docs/conventions.md, "Bytes"; issue #28 item 1), each expected figure
derived by hand from the tensor shapes: gathers read the indices and the rows gathered, not
the table; in-place indexed writes read the indices and the source and write the elements
they update, not the buffer; identities move nothing; fused attention reads q, k, v (and the
mask) and writes its outputs. fp32 = 4 bytes, int64 = 8, bool = 1, bf16 = 2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import count_flops, predict
from flopcount.core.traffic import call_traffic
from flopcount.types import OpCall, TensorMeta

TRACERS = ["auto", "dispatch", "jit"]


def _op(result, op):
    t = result.operator_totals()[op]
    return t.bytes_read, t.bytes_written


# -- gathers -----------------------------------------------------------------------------

@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("train", [False, True])
def test_embedding_reads_ids_and_rows_not_the_table(tracer, batch, train):
    emb = nn.Embedding(50_000, 64).train(train)
    ids = torch.randint(0, 50_000, (batch, 16))
    n = batch * 16
    r = count_flops(emb, ids, tracer=tracer)
    # n int64 ids + n rows of 64 fp32 read; n rows written. The table is 12.8 MB.
    assert _op(r, "aten::embedding") == (n * 8 + n * 64 * 4, n * 64 * 4)


def test_embedding_on_a_million_rows_issue_figure():
    # the issue's case: nn.Embedding(1_000_000, 64), 16 int64 ids, fp32:
    # read 16*8 + 16*64*4 = 4224, write 16*64*4 = 4096 (the whole table was 256,000,000 bytes)
    emb = nn.Embedding(1_000_000, 64, device="meta")
    r = count_flops(emb, torch.zeros(1, 16, dtype=torch.long, device="meta"))
    assert _op(r, "aten::embedding") == (4224, 4096)


@pytest.mark.parametrize("dtype, size", [(None, 4), ("bfloat16", 2)])
def test_predict_books_the_embedding_rows_not_the_table(dtype, size):
    emb = nn.Embedding(1_000_000, 64, device="meta")
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    result = predict(emb, ids, on="h100", dtype=dtype)
    # ids 16*8 stay int64; the 16 rows read and written at the priced dtype's size
    assert sum(row.bytes for row in result.rows) == 16 * 8 + 2 * 16 * 64 * size
    assert sum(row["bytes"] for row in result.to_dict()["rows"]) == 16 * 8 + 2 * 16 * 64 * size


class _Gathers(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(300, 32))

    def forward(self, ids, cols):
        a = torch.index_select(self.table, 0, ids.flatten())   # (B*8, 32)
        b = torch.gather(self.table, 1, cols)                  # cols (300, 3) -> (300, 3)
        c = torch.take(self.table, ids)                        # (B, 8)
        d = self.table[ids]                                    # advanced indexing: (B, 8, 32)
        return a.sum() + b.sum() + c.sum() + d.sum()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 3])
def test_gathers_read_indices_and_elements_gathered(tracer, batch):
    ids = torch.randint(0, 300, (batch, 8))
    cols = torch.randint(0, 32, (300, 3))
    r = count_flops(_Gathers().eval(), (ids, cols), tracer=tracer)
    n = batch * 8
    assert _op(r, "aten::index_select") == (n * 8 + n * 32 * 4, n * 32 * 4)
    assert _op(r, "aten::gather") == (900 * 8 + 900 * 4, 900 * 4)
    assert _op(r, "aten::take") == (n * 8 + n * 4, n * 4)
    assert _op(r, "aten::index") == (n * 8 + n * 32 * 4, n * 32 * 4)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 3])
def test_embedding_bag_reads_indices_offsets_and_rows(tracer, batch):
    bag = nn.EmbeddingBag(5000, 32, mode="sum").eval()
    ids = torch.randint(0, 5000, (batch, 10))
    r = count_flops(bag, ids, tracer=tracer)
    # 2-D input: torch makes offsets (batch,) int64. Read: ids + offsets + 10*batch rows.
    read = batch * 10 * 8 + batch * 8 + batch * 10 * 32 * 4
    # written: the bags (batch, 32) fp32 and the kernel's bookkeeping outputs, which in sum
    # mode are an empty offset2bag, bag_size (batch,) and max_indices (batch,), int64
    written = batch * 32 * 4 + 2 * batch * 8
    assert _op(r, "aten::embedding_bag") == (read, written)


def test_gather_backward_ops_and_the_dense_embedding_grad():
    # embedding_dense_backward really writes the whole grad table (it zero-fills it and adds
    # the rows): read grad_output (B*T*D fp32) + ids, write num_weights * D fp32.
    emb = nn.Embedding(1000, 16)
    ids = torch.randint(0, 1000, (3, 5))
    r = count_flops(emb, ids, tracer="dispatch", backward=True)
    assert _op(r, "aten::embedding_dense_backward") == (3 * 5 * 16 * 4 + 3 * 5 * 8, 1000 * 16 * 4)


class _GatherGrads(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(300, 32))

    def forward(self, ids, cols):
        return (torch.index_select(self.w, 0, ids.flatten()).sum() + torch.gather(self.w, 1, cols).sum()
                + self.w[ids].sum() + torch.take(self.w, ids).sum())


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("batch", [2, 3])
def test_gather_backwards_move_the_rows_they_add_not_the_table(tracer, batch):
    # autograd's formulas run new_zeros(table).index_add_(...) (scatter_add_, _index_put_impl_,
    # put_) in place when no dispatch mode is active; the zeros are their own event, and the
    # accumulation reads the index, the incoming gradient and the rows it adds to, and writes
    # those rows. The table is 300*32*4 = 38,400 bytes: not booked by the accumulation.
    ids = torch.randint(0, 300, (batch, 8))
    cols = torch.randint(0, 32, (300, 2))
    r = count_flops(_GatherGrads(), (ids, cols), tracer=tracer, backward=True)
    n = batch * 8
    rows = n * 32 * 4
    assert _op(r, "aten::index_add") == (n * 8 + rows + rows, rows)          # index_select's
    assert _op(r, "aten::index_put") == (n * 8 + rows + rows, rows)          # w[ids]'s
    assert _op(r, "aten::scatter_add") == (600 * 8 + 600 * 4 * 2, 600 * 4)  # gather's: 300x2 elements
    assert _op(r, "aten::put") == (n * 8 + n * 4 * 2, n * 4)                 # take's
    # each fills fresh zeros the size of the table: written once, read never
    assert r.operator_totals()["aten::new_zeros"].bytes_read == 0


def test_take_backward_is_supported():
    # autograd's backward of take is put(zeros, index, grad, accumulate=True): one add per index
    class Take(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(40, 5))

        def forward(self, i):
            return torch.take(self.w, i).sum()

    r = count_flops(Take(), torch.randint(0, 200, (4, 6)), tracer="dispatch", backward=True)
    assert r.complete
    assert r.by_operator()["aten::put"] == 24


# -- in-place indexed writes -------------------------------------------------------------

class _Cache(nn.Module):
    """A static KV cache (B, H, S, D) updated in place at T positions, five ways."""

    def __init__(self, batch, how):
        super().__init__()
        self.how = how
        self.register_buffer("cache", torch.zeros(batch, 4, 512, 16))

    def forward(self, new, pos):
        cache = self.cache
        if self.how == "index_copy_":
            cache.index_copy_(2, pos, new)
        elif self.how == "index_put_":
            cache[:, :, pos] = new
        elif self.how == "index_put_accumulate":
            rows, heads = torch.arange(cache.shape[0])[:, None, None], torch.arange(4)[None, :, None]
            cache.index_put_((rows, heads, pos[None, None, :]), new, accumulate=True)
        elif self.how == "copy_":
            cache[:, :, 100:100 + new.shape[2]] = new
        elif self.how == "index_add_":
            cache.index_add_(2, pos, new)
        return cache[:, :, :1].sum()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("how, accumulate", [
    ("index_copy_", False), ("index_put_", False), ("copy_", False), ("index_add_", True),
])
def test_cache_updates_move_the_updated_elements_not_the_buffer(tracer, batch, how, accumulate):
    t = 2
    new = torch.randn(batch, 4, t, 16)
    pos = torch.tensor([7, 300])
    model = _Cache(batch, how)
    before = model.cache.clone()
    r = count_flops(model, (new, pos), tracer=tracer)
    assert torch.equal(model.cache, before)  # left as found
    updated = batch * 4 * t * 16 * 4          # the elements written, fp32
    index = 0 if how == "copy_" else t * 8    # int64 positions (a slice has none)
    # read: positions + the new values (+ the old values when adding); write: the updated slots.
    # The whole cache is batch*4*512*16*4 bytes: never booked.
    op = {"index_put_": "aten::index_put_"}.get(how, f"aten::{how}")
    assert _op(r, op) == (index + updated + (updated if accumulate else 0), updated)


@pytest.mark.parametrize("batch", [2, 3])
def test_index_put_with_three_index_tensors_and_accumulate(batch):
    t = 2
    new = torch.randn(batch, 4, t, 16)
    pos = torch.tensor([7, 300])
    r = count_flops(_Cache(batch, "index_put_accumulate"), (new, pos), tracer="dispatch")
    # indices: arange(batch) (batch,1,1), arange(4) (1,4,1), pos (1,1,2): broadcast (batch,4,2)
    # selects batch*4*2 rows of D=16 fp32; read the three index tensors, the values and the old rows
    rows = batch * 4 * t * 16 * 4
    assert _op(r, "aten::index_put_") == ((batch + 4 + t) * 8 + rows + rows, rows)


class _Scatters(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.register_buffer("buf", torch.zeros(3, 1000))

    def forward(self, index, src):
        buf = self.buf.clone()
        if self.how == "scatter_":
            buf.scatter_(1, index, src)
        elif self.how == "scatter_value":
            buf.scatter_(1, index, 2.0)
        elif self.how == "scatter_add_":
            buf.scatter_add_(1, index, src)
        elif self.how == "scatter_reduce_":
            buf.scatter_reduce_(1, index, src, reduce="amax")
        elif self.how == "index_fill_":
            buf.index_fill_(1, index[0], -1.0)
        elif self.how == "masked_fill_":
            buf.masked_fill_(src[:, :1] > 0, 0.0)
        return buf


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("how", ["scatter_", "scatter_value", "scatter_add_", "scatter_reduce_", "index_fill_"])
def test_scatters_move_the_indexed_elements(tracer, how):
    index = torch.randint(0, 1000, (3, 5))
    src = torch.randn(3, 8)  # larger than index: only index.numel elements are used
    r = count_flops(_Scatters(how), (index, src), tracer=tracer)
    n = 15
    op = "aten::scatter_" if how == "scatter_value" else f"aten::{how}"
    read, written = _op(r, op)
    if how == "index_fill_":
        # index[0] has 5 positions along dim 1: 3 rows * 5 columns filled
        assert (read, written) == (5 * 8, 15 * 4)
    elif how == "scatter_value":
        assert (read, written) == (n * 8, n * 4)
    elif how == "scatter_":
        assert (read, written) == (n * 8 + n * 4, n * 4)
    else:  # add/amax: the old elements are read too
        assert (read, written) == (n * 8 + n * 4 + n * 4, n * 4)


@pytest.mark.parametrize("tracer", TRACERS)
def test_masked_fill_reads_its_mask(tracer):
    # mask (3, 1) bool broadcast over (3, 1000): read 3 bytes; how many elements it selects is
    # data, so the bytes written take the least (none) and the whole buffer is not booked
    r = count_flops(_Scatters("masked_fill_"), (torch.zeros(3, 5, dtype=torch.long), torch.randn(3, 8)), tracer=tracer)
    assert _op(r, "aten::masked_fill_") == (3, 0)


def test_masked_scatter_and_put_rules():
    self_meta = TensorMeta((100, 100), "float32")
    mask = TensorMeta((100, 100), "bool")
    src = TensorMeta((50,), "float32")
    call = OpCall("aten::masked_scatter_", {"self": self_meta, "mask": mask, "source": src}, (self_meta,))
    assert call_traffic(call, view=False) == (10_000, 0)
    index = TensorMeta((7,), "int64")
    put = OpCall("aten::put_", {"self": self_meta, "index": index, "source": TensorMeta((7,), "float32"),
                                "accumulate": True}, (self_meta,))
    assert call_traffic(put, view=False) == (7 * 8 + 7 * 4 + 7 * 4, 7 * 4)


# -- identities ------------------------------------------------------------------------

class _Identities(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(x)
        return torch.ops.aten.alias(y.to(torch.float32).detach().contiguous())


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 5])
def test_eval_dropout_and_no_op_conversions_move_nothing(tracer, batch):
    x = torch.randn(batch, 64)
    r = count_flops(_Identities().eval(), x, tracer=tracer)
    assert r.bytes == 0


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 5])
def test_train_dropout_reads_and_writes(tracer, batch):
    x = torch.randn(batch, 64)
    r = count_flops(nn.Dropout(0.5).train(), x, tracer=tracer)
    # reads x, writes the result (the mask is the kernel's own, not seen as an output of F.dropout)
    assert _op(r, "aten::dropout") == (batch * 64 * 4, batch * 64 * 4)


class _Convert(nn.Module):
    def forward(self, x):
        return x.to(torch.float64)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 5])
def test_a_real_dtype_conversion_moves_its_bytes(tracer, batch):
    r = count_flops(_Convert(), torch.randn(batch, 64), tracer=tracer)
    # jit records aten::to (an alias in its schema, yet a copy here), dispatch aten::_to_copy
    assert r.bytes_read == batch * 64 * 4 and r.bytes_written == batch * 64 * 8


class _Clone(nn.Module):
    def forward(self, x):
        return x.clone(), torch.zeros_like(x), x.new_zeros(x.shape[0], 3)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [2, 5])
def test_clone_moves_bytes_and_factories_read_nothing(tracer, batch):
    r = count_flops(_Clone(), torch.randn(batch, 64), tracer=tracer)
    n = batch * 64 * 4
    assert _op(r, "aten::clone") == (n, n)
    assert _op(r, "aten::zeros_like") == (0, n)
    assert _op(r, "aten::new_zeros") == (0, batch * 3 * 4)


def test_size_queries_move_nothing():
    x = TensorMeta((4, 5), "float32")
    assert call_traffic(OpCall("aten::numel", {"self": x}, (None,)), view=False) == (0, 0)
    assert call_traffic(OpCall("aten::size", {"self": x, "dim": 0}, (None,)), view=False) == (0, 0)


# -- fused attention ---------------------------------------------------------------------

class _Sdpa(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 2])
def test_sdpa_reads_q_k_v_and_the_mask_and_writes_its_output(tracer, batch):
    q = torch.randn(batch, 4, 8, 16)
    k, v = torch.randn(batch, 2, 8, 16), torch.randn(batch, 2, 8, 16)  # grouped-query: 2 kv heads
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    r = count_flops(_Sdpa(), (q, k, v, mask), tracer=tracer)
    qo = batch * 4 * 8 * 16 * 4
    kv = batch * 2 * 8 * 16 * 4
    read, written = _op(r, "aten::scaled_dot_product_attention")
    # the (L, L) scores never leave the kernel: q + k + v + the bool mask, the output
    assert (read, written) == (qo + 2 * kv + 64, qo)


def test_sdpa_backward_kernel_reads_its_saved_tensors():
    q = torch.randn(2, 4, 8, 16, requires_grad=True)

    class Attn(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x * 2, x * 3)

    r = count_flops(Attn(), q, tracer="dispatch", backward=True)
    totals = {op: t for op, t in r.operator_totals().items() if "scaled_dot_product" in op and "backward" in op}
    assert len(totals) == 1
    (t,) = totals.values()
    n = 2 * 4 * 8 * 16 * 4
    # read grad_out, q, k, v, out (5 x n) and the logsumexp (B, H, L) fp32; write dq, dk, dv
    assert (t.bytes_read, t.bytes_written) == (5 * n + 2 * 4 * 8 * 4, 3 * n)
