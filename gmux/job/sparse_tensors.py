"""Sparse COO tensors in a checkpoint: an Embedding(sparse=True)'s gradient, and optimizer state made from one (SGD's
momentum buffer), held as two ordinary rows of the tensor table, its indices and its values, and a SparseRef in
the skeleton that says how they make the tensor (gmux.job.checkpoint).

A loop that calls optimizer.zero_grad() at its top still holds the last step's gradients at every boundary: a
checkpoint that refused them refused such a job every move. The tensor is written as it is, never coalesced: its
indices in their order, its values and its coalesced flag come back as they were, and the run goes on exactly
(coalescing sums repeated entries, and the next step would round otherwise).

A checkpoint file is untrusted input, so a SparseRef is checked three times, each before anything in the job
changes: its fields as the skeleton is decoded (`builder`); its rows against the table before anything is
allocated (`rows`: int64 indices shaped [sparse dims, nnz], values shaped [nnz, *dense dims], no more entries
than a coalesced tensor of its size has places for); and its indices once read (`join`: each within its
dimension's size, in order and unique where it claims to be coalesced). gmux.job.restore_check compares its size
and dtype with the live parameter's (`fits`).

Compressed layouts (CSR, CSC, BSR, BSC: a graph's adjacency buffer) and nested tensors are refused by name
(`unstorable`): no optimizer makes one of a gradient, and their invariants are another format's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .checkpoint_error import CheckpointError
from .skeleton import SkeletonError

LAYOUTS = {"sparse_coo": torch.sparse_coo}
FIELDS = {"layout", "size", "coalesced", "indices", "values"}
_MAX_NUMEL = 2 ** 63 - 1         # torch's: a size with more elements cannot be made


@dataclass(frozen=True)
class SparseRef:
    """A sparse tensor in the skeleton: its layout, size and coalesced flag, and the TensorRefs of the table rows
    holding its indices and its values."""
    layout: str
    size: tuple
    coalesced: bool
    indices: object
    values: object


def unstorable(t: torch.Tensor) -> Optional[str]:
    """Why a checkpoint cannot hold `t`, or None."""
    if t.is_nested or t.layout not in (torch.strided, torch.sparse_coo):
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        return f"a {kind} tensor: checkpoints hold dense and sparse COO tensors only"
    return None


def split(t: torch.Tensor, place: Callable[[torch.Tensor], object]) -> SparseRef:
    """`t` as the skeleton holds it, `place` putting each of its two parts in the table (giving its TensorRef)."""
    # (_indices and _values, not indices(): those refuse an uncoalesced tensor, which a gradient mostly is)
    return SparseRef("sparse_coo", tuple(t.shape), t.is_coalesced(), place(t._indices()), place(t._values()))


def parts(t: torch.Tensor) -> tuple:
    """A sparse tensor (an Embedding(sparse=True)'s gradient, a graph's CSR adjacency) has no storage of its own:
    its indices and values do."""
    if t.layout == torch.sparse_coo:
        return t._indices(), t._values()
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices(), t.values()
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return t.ccol_indices(), t.row_indices(), t.values()
    return (t,)


def memory(t: torch.Tensor) -> set:
    """Where `t`'s data lies (its storages' addresses): of a sparse tensor, its parts'. An empty tensor's is none."""
    return {p.untyped_storage().data_ptr() for p in parts(t) if p.numel()}


# -- reading ------------------------------------------------------------------------------------------------
def builder(ref_type: type, max_rank: int) -> Callable[[object], SparseRef]:
    """The decoder's constructor of a SparseRef (gmux.job.skeleton: BUILD, from a dict the file chose): only the
    fields gmux writes, each of its type, the indices and values `ref_type`s (TensorRefs)."""
    def make_ref(state) -> SparseRef:
        if type(state) is not dict or set(state) != FIELDS:
            raise SkeletonError(f"a sparse tensor reference without exactly the fields {sorted(FIELDS)}")
        size = state["size"]
        if not (type(size) is tuple and len(size) <= max_rank
                and all(type(d) is int and 0 <= d <= _MAX_NUMEL for d in size)):
            raise SkeletonError(f"a sparse tensor reference whose size is not a tuple of at most {max_rank} sizes")
        if state["layout"] not in LAYOUTS:
            raise SkeletonError(f"a sparse tensor reference of layout {str(state['layout'])[:40]!r}, not one of "
                                f"{sorted(LAYOUTS)}")
        if type(state["coalesced"]) is not bool:
            raise SkeletonError("a sparse tensor reference whose coalesced flag is not a bool")
        if type(state["indices"]) is not ref_type or type(state["values"]) is not ref_type:
            raise SkeletonError("a sparse tensor reference whose indices or values are not tensor references")
        return SparseRef(**state)
    return make_ref


def rows(ref: SparseRef, table: list, origin: str) -> tuple:
    """`ref`'s two references to the table, once the rows they name are found to make the tensor it says (before
    anything is allocated for them); CheckpointError where they do not."""
    if not all(0 <= r.index < len(table) for r in (ref.indices, ref.values)):
        raise CheckpointError(origin, f"corrupt: a sparse tensor's indices and values are tensors "
                                      f"{ref.indices.index} and {ref.values.index} of {len(table)}")
    if problem := _unfit(ref, table[ref.indices.index], table[ref.values.index]):
        raise CheckpointError(origin, f"corrupt: {problem}")
    return ref.indices, ref.values


def _unfit(ref: SparseRef, indices, values) -> Optional[str]:
    size = list(ref.size)
    if indices.dtype != "int64":
        return f"a sparse tensor's indices are {indices.dtype}, not int64"
    if len(indices.shape) != 2 or indices.shape[0] > len(size):
        return (f"a sparse tensor of size {size} has indices shaped {list(indices.shape)}, not [sparse dims, nnz] "
                f"with at most {len(size)} sparse dims")
    sparse_dim, nnz = indices.shape
    if list(values.shape) != [nnz, *size[sparse_dim:]]:
        return (f"a sparse tensor of size {size} has {nnz} indices and values shaped {list(values.shape)}, not "
                f"{[nnz, *size[sparse_dim:]]} (nnz, then its dense dims)")
    if math.prod(size) > _MAX_NUMEL:
        return f"a sparse tensor of size {size}, more elements than a tensor can have"
    places = math.prod(size[:sparse_dim])
    if nnz > places and (ref.coalesced or places == 0):       # (repeated places: only an uncoalesced one)
        return (f"a {'coalesced ' if ref.coalesced else ''}sparse tensor of size {size} claims {nnz} entries, more "
                f"than its {places} places")
    return None


def fits(ref: SparseRef, table: list, dtype: str, shape: tuple, origin: str, where: str) -> int:
    """The bytes of the table `ref` stands for that the job vouches for (`nbytes`), once its size and dtype are
    found the live ones (`dtype`, `shape`: a parameter's, whose gradient or optimizer state it is); else
    CheckpointError naming `where`."""
    if ref.size != tuple(shape):
        raise CheckpointError(origin, f"{where}: a sparse tensor of size {list(ref.size)}, the job's is {list(shape)}")
    if table[ref.values.index].dtype != dtype:
        raise CheckpointError(origin, f"{where}: a sparse tensor of dtype {table[ref.values.index].dtype}, the job "
                                      f"has {dtype}")
    return nbytes(ref, table)


def nbytes(ref, table: list) -> int:
    """The bytes of the table a reference (a TensorRef or a SparseRef) stands for that a job may vouch for: a
    SparseRef's at most a coalesced tensor's of its size (repeated entries, an uncoalesced gradient's, count as
    data the job does not hold, bounded by the stream)."""
    if not isinstance(ref, SparseRef):
        return table[ref.index].nbytes
    indices, values = table[ref.indices.index], table[ref.values.index]
    nnz, places = indices.shape[1], math.prod(ref.size[:indices.shape[0]])
    carried = indices.nbytes + values.nbytes
    return carried if nnz <= places else places * (carried // nnz)


def join(ref: SparseRef, tensors: list, origin: str) -> torch.Tensor:
    """The tensor `ref` stands for, made of the rows read (`tensors`, in table order, fitting it: `rows`), once
    its indices are found within its size, and in order and unique where it says it is coalesced."""
    indices, values = tensors[ref.indices.index], tensors[ref.values.index]
    if indices.numel():
        bound = torch.tensor(ref.size[:indices.shape[0]], dtype=torch.int64)
        outside = ((indices.min(1).values < 0) | (indices.max(1).values >= bound)).nonzero()
        if len(outside):
            d = int(outside[0])
            low, high = int(indices[d].min()), int(indices[d].max())
            raise CheckpointError(origin, f"corrupt: a sparse tensor of size {list(ref.size)} has indices from {low} "
                                          f"to {high} in dim {d}, outside its {ref.size[d]}")
    if ref.coalesced and not _ordered(indices):
        raise CheckpointError(origin, "corrupt: a sparse tensor says it is coalesced, and its indices are not in "
                                      "order and unique")
    try:
        return torch.sparse_coo_tensor(indices, values, ref.size, is_coalesced=ref.coalesced, check_invariants=True)
    except RuntimeError as e:     # (what the checks above did not foresee: torch's own invariants)
        raise CheckpointError(origin, f"corrupt: a sparse tensor torch refuses: {str(e).splitlines()[0][:200]}"
                              ) from None


def _ordered(indices: torch.Tensor) -> bool:
    """Each column of `indices` after the one before, compared dim by dim (row-major): coalesced."""
    if indices.shape[1] < 2:
        return True
    if indices.shape[0] == 0:       # (no sparse dims: every entry is at the one place)
        return False
    step = indices[:, 1:] - indices[:, :-1]
    first = (step != 0).int().argmax(0)      # the first dim where neighbours differ (0 where none does)
    return bool((step.gather(0, first.unsqueeze(0)) > 0).all())
