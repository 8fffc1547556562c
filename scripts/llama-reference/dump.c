// Greedy continuations and top logits from llama.cpp, for references made on a CPU the host
// cannot run natively (an aarch64 build under qemu-aarch64): the same settings as
// scripts/make-reference.py (llama-cpp-python's defaults: one thread, 512-token batches, f16 KV
// cache, no flash attention, logits of the last position only).
//
// Usage: dump MODEL.gguf < cases > results
// Each input line is one case: `N_GEN ADD_BOS SPECIAL STEPS HEXTEXT` (STEPS: comma-separated
// steps whose top logits to print, `-` for none). Each output line answers one case:
// `prompt=ID,ID,... generated=ID,... text=HEX logits=STEP:ID/VALUE;ID/VALUE...|STEP:...`
// (values as %.9g, which an f32 survives exactly). `info=` on the first line is llama.cpp's
// system info.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define TOP 20

static const float *g_logits;

// Descending by value, ascending by id among equals: numpy's stable argsort of -logits.
static int by_logit(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_logits[x] > g_logits[y]) return -1;
    if (g_logits[x] < g_logits[y]) return 1;
    return x - y;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static bool no_progress(float progress, void *data) {
    (void)progress;
    (void)data;
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < cases\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.progress_callback = no_progress;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    printf("info=%s\n", llama_print_system_info());
    const llama_token eos = llama_vocab_eos(vocab);
    int *order = malloc(sizeof(int) * n_vocab);
    static char line[1 << 20];
    static char text[1 << 19];
    static llama_token ids[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        int n_gen, add_bos, special;
        char steps[4096], hex[sizeof line];
        if (sscanf(line, "%d %d %d %4095s %s", &n_gen, &add_bos, &special, steps, hex) != 5) {
            fprintf(stderr, "bad case line\n");
            return 2;
        }
        size_t n = strlen(hex) / 2;
        for (size_t i = 0; i < n; i++) text[i] = (char)(hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]));
        text[n] = 0;
        int n_prompt = llama_tokenize(vocab, text, (int)n, ids, 1 << 16, add_bos, special);
        if (n_prompt < 0) {
            fprintf(stderr, "prompt too long\n");
            return 1;
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        printf("prompt=");
        for (int i = 0; i < n_prompt; i++) printf(i ? ",%d" : "%d", ids[i]);
        for (int i = 0; i < n_prompt; i += 512) {
            int len = n_prompt - i < 512 ? n_prompt - i : 512;
            if (llama_decode(ctx, llama_batch_get_one(ids + i, len))) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
        }
        llama_token out[4096];
        int n_out = 0;
        char logits[1 << 16];
        size_t lo = 0;
        for (int step = 0; step < n_gen; step++) {
            const float *lg = llama_get_logits_ith(ctx, -1);
            int best = 0;
            for (int t = 1; t < n_vocab; t++)
                if (lg[t] > lg[best]) best = t;
            char key[32];
            snprintf(key, sizeof key, ",%d,", step);
            char padded[4100];
            snprintf(padded, sizeof padded, ",%s,", steps);
            if (strstr(padded, key)) {
                g_logits = lg;
                for (int t = 0; t < n_vocab; t++) order[t] = t;
                qsort(order, n_vocab, sizeof(int), by_logit);
                lo += snprintf(logits + lo, sizeof logits - lo, "%s%d:", lo ? "|" : "", step);
                for (int k = 0; k < TOP; k++)
                    lo += snprintf(logits + lo, sizeof logits - lo, "%s%d/%.9g", k ? ";" : "",
                                   order[k], lg[order[k]]);
            }
            out[n_out++] = best;
            if (best == eos || best == 0 || best == 2) break;
            llama_token next = best;
            if (llama_decode(ctx, llama_batch_get_one(&next, 1))) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
        }
        printf(" generated=");
        for (int i = 0; i < n_out; i++) printf(i ? ",%d" : "%d", out[i]);
        printf(" text=");
        for (int i = 0; i < n_out; i++) {
            char piece[256];
            int m = llama_token_to_piece(vocab, out[i], piece, sizeof piece, 0, false);
            for (int j = 0; j < m; j++) printf("%02x", (unsigned char)piece[j]);
        }
        printf(" logits=%s\n", logits);
        fflush(stdout);
    }
    free(order);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
