"""Ops that do no floating-point arithmetic: views, copies, indexing, tensor creation,
random sampling, dtype/device moves, the scalar plumbing jit records and profiler markers.

Only ops whose result is a rearrangement, a copy, a constant or a random draw belong
here; anything that adds, multiplies or compares tensor data gets a handler instead,
so an unknown op is reported rather than silently counted as zero.
"""

from __future__ import annotations

from flopcount.core.registry import HandlerRegistry

__all__ = ["register", "ZERO_OPS"]

_VIEWS = (
    "view", "view_as", "reshape", "reshape_as", "_reshape_alias", "_unsafe_view", "flatten", "unflatten",
    "squeeze", "unsqueeze", "permute", "transpose", "t", "numpy_T", "mT", "mH", "adjoint", "movedim", "moveaxis",
    "swapaxes", "swapdims", "expand", "expand_as", "broadcast_to", "broadcast_tensors", "atleast_1d", "atleast_2d",
    "atleast_3d", "as_strided", "alias", "unfold", "real", "imag", "view_as_real", "view_as_complex",
    "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk", "unsafe_chunk", "unbind",
    "tensor_split", "hsplit", "vsplit", "dsplit", "narrow", "slice", "select", "diagonal", "meshgrid",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    "lift", "lift_fresh", "detach", "resolve_conj", "resolve_neg", "conj", "_conj", "_neg_view",
    "matrix_H", "view_as_real_copy", "view_as_complex_copy",
)
_COPIES = (
    "contiguous", "clone", "copy", "_copy_from", "_copy_from_and_resize", "to", "_to_copy", "type_as",
    "lift_fresh_copy", "narrow_copy", "index", "_unsafe_index", "index_select", "gather", "take",
    "take_along_dim", "masked_select", "cat", "concat", "concatenate", "_cat", "stack", "hstack", "vstack",
    "dstack", "column_stack", "pad", "_pad_enum", "_pad_circular", "constant_pad_nd", "reflection_pad1d",
    "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "embedding", "repeat", "repeat_interleave", "tile", "roll", "flip", "fliplr", "flipud", "rot90",
    "diag", "diag_embed", "diagflat", "tril", "triu", "im2col", "one_hot", "index_copy", "index_fill",
    "masked_scatter", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    "select_backward", "slice_backward", "diagonal_backward", "expand_copy", "view_copy", "permute_copy",
    "t_copy", "transpose_copy", "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "split_copy",
    "alias_copy", "detach_copy", "unbind_copy", "_unsafe_view_copy", "set", "resize", "resize_as",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "nonzero", "nonzero_static", "argwhere",
    "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "bucketize", "searchsorted",
    # packing/padding variable-length sequences and nested tensors: data moves by position
    "_pack_padded_sequence", "_pad_packed_sequence", "pad_sequence", "_nested_tensor_from_mask", "_nested_from_padded",
    "_nested_tensor_from_tensor_list", "to_padded_tensor", "nested_to_padded_tensor", "complex",
    "max_unpool2d", "max_unpool3d",
    # sparse layouts: conversions and the parts of a sparse tensor move data, compute nothing
    # (the products are in matmul.py, docs/conventions.md "Sparse layouts")
    "to_sparse", "_to_sparse", "to_sparse_csr", "_to_sparse_csr", "to_sparse_csc", "_to_sparse_csc",
    "to_sparse_bsr", "_to_sparse_bsr", "to_sparse_bsc", "_to_sparse_bsc", "to_dense", "_to_dense",
    "sparse_coo_tensor", "_sparse_coo_tensor_unsafe", "_sparse_coo_tensor_with_dims_and_tensors",
    "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor",
    "_sparse_compressed_tensor_unsafe", "sparse_compressed_tensor", "coalesce", "_coalesce", "_coalesced",
    "values", "_values", "indices", "_indices", "crow_indices", "col_indices", "ccol_indices", "row_indices",
    "_nnz", "sparse_dim", "dense_dim", "sparse_resize_", "sparse_resize_and_clear_",
)
_CREATION = (
    "zeros", "ones", "empty", "empty_strided", "empty_permuted", "full", "arange", "linspace", "logspace", "eye",
    "scalar_tensor", "tensor", "as_tensor", "from_file", "zeros_like", "ones_like", "empty_like", "full_like",
    "new_zeros", "new_ones", "new_empty", "new_empty_strided", "new_full", "new_tensor", "fill", "zero",
    "tril_indices", "triu_indices", "_efficientzerotensor",
)
_RANDOM = (
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "normal",
    "uniform", "random", "exponential", "geometric", "cauchy", "log_normal", "multinomial", "poisson",
)
_SCALARS = (
    "size", "sym_size", "numel", "sym_numel", "stride", "sym_stride", "sym_storage_offset", "dim", "len",
    "Int", "Float", "Bool", "ScalarImplicit", "item", "_local_scalar_dense", "is_floating_point", "is_complex",
    "is_contiguous", "is_nonzero", "is_same_size", "_shape_as_tensor", "_assert_async", "_assert_scalar",
    "_functional_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range", "sym_constrain_range_for_size",
    "_has_compatible_shallow_copy_type", "record_stream", "__getitem__", "device", "dtype", "layout",
    # forward-mode AD's check that a tangent may share its primal's layout (torch.func.jvp)
    "_has_same_storage_numel",
    # a mask-shape check: tells whether a padding mask is left-aligned (a bool, no arithmetic on data)
    "_nested_tensor_from_mask_left_aligned",
    "contiguous_format", "data", "requires_grad_", "retain_grad", "_version", "output_nr",
)
_PRIM = (
    "NumToTensor", "device", "dtype", "layout", "shape", "data", "is_cuda", "is_cpu", "is_meta", "unchecked_cast",
    "TupleIndex", "ListIndex", "min", "max", "requires_grad", "layout", "name", "Uninitialized",
)
# torch.profiler.record_function markers (also emitted by DataParallel): bookkeeping only.
_PROFILER = ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")

ZERO_OPS = tuple(
    sorted(
        {f"aten::{name}" for name in _VIEWS + _COPIES + _CREATION + _RANDOM + _SCALARS}
        | {f"prim::{name}" for name in _PRIM}
        | {f"profiler::{name}" for name in _PROFILER}
    )
)


def register(registry: HandlerRegistry) -> None:
    registry.register_zero(ZERO_OPS)
