"""gmux.job.crc.crc32 gives zlib.crc32's value for every input: the native fold (csrc/crc32.c) at every length
and alignment around its 16- and 64-byte blocks, chained from any start, and on views."""
import os
import zlib

from hypothesis import given, settings, strategies as st

from gmux.job import crc
from gmux.job.memory import native


def test_it_runs_natively_where_gmux_is_built():
    assert crc._native is not None or not native.available()


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=0, max_size=9000), start=st.integers(0, 2**32 - 1), cut=st.integers(0, 40))
def test_equals_zlib_for_any_bytes_start_and_offset(data, start, cut):
    view = memoryview(data)[min(cut, len(data)):]
    assert crc.crc32(view, start) == zlib.crc32(view, start)
    assert crc.crc32(data, start) == zlib.crc32(data, start)


def test_equals_zlib_at_every_length_around_the_fold_and_on_large_buffers():
    block = os.urandom(70000)
    for n in [*range(crc.NATIVE_FROM - 70, crc.NATIVE_FROM + 140), 65536 + 63, 69999]:
        assert crc.crc32(block[:n]) == zlib.crc32(block[:n]), n
        assert crc.crc32(memoryview(block)[1:n]) == zlib.crc32(block[1:n]), n
    big = os.urandom(24 << 20)
    assert crc.crc32(big, 12345) == zlib.crc32(big, 12345)
    # a chain over pieces, as the checkpoint reader checks a frame read into several tensors
    assert crc.crc32(big[7:], crc.crc32(big[:7])) == zlib.crc32(big)
