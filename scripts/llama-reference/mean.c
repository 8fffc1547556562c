// ggml's mean pooling (`ggml_mul_mat(ggml_cont(ggml_transpose(states)), column of 1/n)`, as
// llama.cpp's build_pooling writes it) on states made by a fixed formula, for strata's unit
// test of its mean: prints the WIDTH result values as f32 bit patterns in hex.
//
// Usage: mean N WIDTH   (states[t][d] = ((t * 7919 + d * 104729) % 2001) / 1000 - 1)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s N WIDTH\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[1]), width = atoi(argv[2]);
    struct ggml_init_params ip = {(size_t)64 << 20, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *states = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, width, n);
    for (int t = 0; t < n; t++)
        for (int d = 0; d < width; d++)
            ((float *)states->data)[t * width + d] =
                (float)((t * 7919L + d * 104729L) % 2001) / 1000.0f - 1.0f;
    struct ggml_tensor *mean = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1);
    for (int t = 0; t < n; t++) ((float *)mean->data)[t] = 1.0f / (float)n;
    struct ggml_tensor *cur = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, states)), mean);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, cur);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    for (int d = 0; d < width; d++) {
        uint32_t w;
        memcpy(&w, (float *)cur->data + d, 4);
        printf(d ? ",%08x" : "%08x", w);
    }
    printf("\n");
    ggml_free(ctx);
    return 0;
}
