/* Many host copies by address in one call: the state tier's small storages (a model of thousands of small
 * tensors), whose copies each cost more to dispatch from Python (~1 us through ctypes) than to do. */
#include <string.h>

#include "gmux.h"

void gmux_copy_ranges(const uint64_t *dst, const uint64_t *src, const uint64_t *nbytes, uint64_t count)
{
    for (uint64_t i = 0; i < count; i++)
        memmove((void *)(uintptr_t)dst[i], (const void *)(uintptr_t)src[i], (size_t)nbytes[i]);
}
