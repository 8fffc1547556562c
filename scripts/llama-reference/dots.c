// One-row dot products (`vec_dot`) from llama.cpp's CPU backend, for references made on a CPU
// the host cannot run natively (an aarch64 build under qemu-aarch64): the same products as
// scripts/make-dot-vectors.py takes from an x86 build through ctypes.
//
// Usage: dots < cases > results
// Each input line is one case: `TYPE N NRC ECHO` then NRC weight rows and NRC activation rows, each
// N floats as hex of their little-endian bytes. The weights are quantised with
// ggml_quantize_chunk, the activations with the `from_float` of the type's `vec_dot_type`, and
// `vec_dot` is called once with `nrc` = NRC. Each output line answers one case: the f32 results
// as 8-digit hex bits (after the quantised weight bytes in hex and a space if ECHO is 1), NRC x NRC of them for NRC = 2 (weight row fastest), else one; `-` for
// NRC = 2 where the build takes the format one row at a time (its `nrows` is 1).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// Reads one whitespace-separated hex word of exactly `n` floats into `out`.
static int read_row(float *out, int64_t n) {
    int c;
    do {
        c = getchar();
    } while (c == ' ');
    unsigned char *b = (unsigned char *)out;
    for (int64_t i = 0; i < 4 * n; i++) {
        int hi = hexval((char)(i == 0 ? c : getchar()));
        int lo = hexval((char)getchar());
        if (hi < 0 || lo < 0) return -1;
        b[i] = (unsigned char)(hi * 16 + lo);
    }
    return 0;
}

int main(void) {
    ggml_cpu_init();
    int type, nrc, echo;
    long long n;
    while (scanf("%d %lld %d %d", &type, &n, &nrc, &echo) == 4) {
        if (n <= 0 || (nrc != 1 && nrc != 2)) {
            fprintf(stderr, "bad case header\n");
            return 1;
        }
        const struct ggml_type_traits_cpu *t = ggml_get_type_traits_cpu((enum ggml_type)type);
        const struct ggml_type_traits_cpu *at = ggml_get_type_traits_cpu(t->vec_dot_type);
        size_t wbytes = ggml_row_size((enum ggml_type)type, n);
        size_t abytes = ggml_row_size(t->vec_dot_type, n);
        float *x = malloc(sizeof(float) * n);
        char *w = malloc(wbytes * 2);
        char *a = malloc(abytes * 2);
        if (!x || !w || !a) return 1;
        for (int r = 0; r < nrc; r++) {
            if (read_row(x, n)) {
                fprintf(stderr, "bad weight row\n");
                return 1;
            }
            ggml_quantize_chunk((enum ggml_type)type, x, w + r * wbytes, 0, 1, n, NULL);
        }
        for (int r = 0; r < nrc; r++) {
            if (read_row(x, n)) {
                fprintf(stderr, "bad activation row\n");
                return 1;
            }
            at->from_float(x, a + r * abytes, n);
        }
        if (nrc > t->nrows) {
            // The build takes this format one row at a time: no pair path to record.
            printf("-\n");
            fflush(stdout);
            free(x);
            free(w);
            free(a);
            continue;
        }
        float s[4] = {0};
        if (echo) {
            // The quantised weight rows first, as hex, for formats whose quantiser rounds
            // differently once GCC fuses its multiplies and adds.
            for (size_t i = 0; i < wbytes * nrc; i++) printf("%02x", (unsigned char)w[i]);
            printf(" ");
        }
        // With nrc = 2 the kernel writes s[0..2] for activation row 0 and s[2..4] for row 1.
        // `bs` counts floats (ggml passes 16 for its own tiles).
        t->vec_dot((int)n, s, 2, w, wbytes, a, abytes, nrc);
        for (int i = 0; i < nrc * nrc; i++) {
            uint32_t bits;
            memcpy(&bits, &s[i], 4);
            printf(i ? " %08x" : "%08x", bits);
        }
        printf("\n");
        fflush(stdout);
        free(x);
        free(w);
        free(a);
    }
    return 0;
}
