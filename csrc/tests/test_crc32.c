/* gmux_crc32 is CRC-32 as zlib computes it: the standard check value, and every length from 0 to 600 at every
 * alignment up to 16 plus large buffers, chained from any start, equal to a plain bit-by-bit CRC. */
#include "check.h"

static uint32_t slow(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t c = ~crc;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

int main(void) {
    CHECK(gmux_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(gmux_crc32(0, "", 0) == 0);
    enum { N = 1 << 20 };
    unsigned char *buf = malloc(N + 64);
    CHECK(buf != NULL);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < N + 64; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
    for (size_t off = 0; off < 16; off++)
        for (size_t n = 0; n <= 600; n++)
            CHECK(gmux_crc32((uint32_t)(n * 2654435761u), buf + off, n) == slow((uint32_t)(n * 2654435761u), buf + off, n));
    CHECK(gmux_crc32(7, buf + 3, N) == slow(7, buf + 3, N));
    CHECK(gmux_crc32(gmux_crc32(0, buf, 1000), buf + 1000, N - 1000) == gmux_crc32(0, buf, N));
    printf("crc32: ok (folded: %s)\n", gmux_crc32_folds() ? "yes" : "no, table only");
    free(buf);
    return 0;
}
