#!/usr/bin/env python3
"""Independent re-derivation of the golden byte vectors in quant_format_test.cpp.

Plain python3 (no numpy). f32 arithmetic is emulated by rounding every operation's exact
double result to f32 (exact for * of two f32; correctly rounded for + - / since double has
more than 2*24+2 bits). Run: python3 tests/quant/golden_bytes.py
"""
import math
import struct


def f32(x):
    return struct.unpack('<f', struct.pack('<f', x))[0]


def f32_bytes(x):
    return list(struct.pack('<f', f32(x)))


def f16_bytes(x):  # IEEE half, round to nearest even (CPython PyFloat_Pack2)
    return list(struct.pack('<e', x))


def bf16_bytes(x):  # round to nearest even on the f32 bit pattern
    bits = struct.unpack('<I', struct.pack('<f', f32(x)))[0]
    bits = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
    return [bits & 0xff, bits >> 8]


def roundf(v):  # C roundf: half away from zero
    return math.copysign(math.floor(abs(v) + 0.5), v)


def q8_0(row):
    out = []
    for g in range(0, len(row), 32):
        x = [f32(v) for v in row[g:g + 32]]
        amax = max(abs(v) for v in x)
        d = f32(amax / 127)
        inv_d = f32(1 / d) if d != 0 else 0.0
        out += f16_bytes(d)
        q = [int(roundf(f32(v * inv_d))) for v in x] + [0] * (32 - len(x))
        out += [c & 0xff for c in q]
    return out


def hfq(row, group, bits):
    levels = (1 << bits) - 1
    out = []
    for g in range(0, len(row), group):
        x = [f32(v) for v in row[g:g + group]]
        lo, hi = min(x), max(x)
        rng = f32(hi - lo)
        scale = f32(rng / levels) if rng > 0 else 1.0
        inv = f32(1 / scale) if rng > 0 else 0.0
        q = []
        for v in x:
            t = f32(f32(f32(v - lo) * inv) + 0.5)
            q.append(min(levels, int(math.floor(t))))
        q += [0] * (group - len(x))
        out += f32_bytes(scale) + f32_bytes(lo)
        if bits == 4:
            out += [q[2 * i] | q[2 * i + 1] << 4 for i in range(group // 2)]
        else:
            for j in range(0, group, 4):
                a, b, c, d = q[j:j + 4]
                out += [(a | (b & 3) << 6) & 0xff, (b >> 2 | (c & 15) << 4) & 0xff, (c >> 4 | d << 2) & 0xff]
    return out


def show(name, data):
    # Trailing zero bytes are elided in the C++ vectors (the test checks they are zero).
    n = len(data)
    while n and data[n - 1] == 0:
        n -= 1
    body = ', '.join(f'0x{b:02x}' for b in data[:n])
    print(f'// {name}: {len(data)} bytes, nonzero prefix {n}')
    print(f'{{{body}}}')


CASES = {
    'q8_0 [127, -2.5, 0.5, 1.5, -0.5, 3.49, -127]': q8_0([127, -2.5, 0.5, 1.5, -0.5, 3.49, -127]),
    'q8_0 [0.1, -0.2, 0.3]': q8_0([0.1, -0.2, 0.3]),
    # Rows where multiplying by the reciprocal (ggml, hipfire) and dividing by the scale give
    # different codes: -29 vs -28, and 14 vs 15. They pin the reciprocal rule.
    'q8_0 reciprocal [0x1.2b4396p+2, -0x1.0ca174p+0]': q8_0([float.fromhex('0x1.2b4396p+2'), float.fromhex('-0x1.0ca174p+0')]),
    'hfq4_g128 reciprocal [-0x1.633334p+2, 0x1.99999ap-4, -0x1.69d07p-4]':
        hfq([float.fromhex('-0x1.633334p+2'), float.fromhex('0x1.99999ap-4'), float.fromhex('-0x1.69d07p-4')], 128, 4),
    # Two groups (K = 33): the second block starts at byte 34 and holds one real value.
    'q8_0 [-16 .. 15, 2]': q8_0([float(i - 16) for i in range(32)] + [2.0]),
    'hfq4_g128 [-1, 0, 0.5, 2, 1.3]': hfq([-1, 0, 0.5, 2, 1.3], 128, 4),
    'hfq4_g256 [0, 1, 2, 3]': hfq([0, 1, 2, 3], 256, 4),
    'hfq4_g256 [1.5, 1.5, 1.5]': hfq([1.5, 1.5, 1.5], 256, 4),
    'hfq6_g256 [0, 6.3, 3.15, 1, 0.05, 2]': hfq([0, 6.3, 3.15, 1, 0.05, 2], 256, 6),
    'f16 [1, -2, 0.1, 65504, 1e-7]': sum((f16_bytes(v) for v in [1, -2, 0.1, 65504, 1e-7]), []),
    'bf16 [1, -2, 0.1, 3.0e38]': sum((bf16_bytes(v) for v in [1, -2, 0.1, 3.0e38]), []),
    'f32 [1, -2, 0.1]': sum((f32_bytes(v) for v in [1, -2, 0.1]), []),
}

if __name__ == '__main__':
    for name, data in CASES.items():
        show(name, data)
