/* bf16 <-> fp32 for one value: a bf16 is the high half of an fp32; back, rounded to nearest even. */
#ifndef KUBEINFER_BF16_H
#define KUBEINFER_BF16_H
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) float bf16_to_f32(uint16_t b) {
    const uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline __attribute__((always_inline)) uint16_t f32_to_bf16(float f) {   /* finite values (-ffast-math) */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
#endif
