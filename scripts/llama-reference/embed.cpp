// Pooled embeddings from llama.cpp, for strata's embedding test: what llama-embedding computes
// (one prompt per batch, special tokens parsed, every token an output, no flash attention),
// with the exact bits of each float.
//
// Usage: embed MODEL.gguf mean|last|cls < prompts > results
// Each input line is one prompt as hex bytes. Each output line answers one:
// `tokens=ID,ID,... raw=WORD,... norm=WORD,...` where `raw` is llama_get_embeddings_seq's
// vector and `norm` the same after common_embd_normalize(.., 2) (llama-embedding's default
// Euclidean normalisation); WORDs are the f32 bit patterns in hex.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common.h"
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void words(const char *name, const float *v, int n) {
    printf(" %s=", name);
    for (int i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &v[i], 4);
        printf(i ? ",%08x" : "%08x", w);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf mean|last|cls < prompts\n", argv[0]);
        return 2;
    }
    enum llama_pooling_type pooling = !strcmp(argv[2], "mean") ? LLAMA_POOLING_TYPE_MEAN
                                      : !strcmp(argv[2], "last") ? LLAMA_POOLING_TYPE_LAST
                                      : !strcmp(argv[2], "cls")  ? LLAMA_POOLING_TYPE_CLS
                                                                 : LLAMA_POOLING_TYPE_UNSPECIFIED;
    if (pooling == LLAMA_POOLING_TYPE_UNSPECIFIED) {
        fprintf(stderr, "pooling must be mean, last or cls\n");
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 2048;
    cp.n_ubatch = 2048;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.embeddings = true;
    cp.pooling_type = pooling;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_embd = llama_model_n_embd(model);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::string text;
        for (size_t i = 0; i + 1 < line.size(); i += 2) text += (char)std::stoi(line.substr(i, 2), nullptr, 16);
        std::vector<llama_token> toks(text.size() + 8);
        int n = llama_tokenize(vocab, text.data(), (int)text.size(), toks.data(), (int)toks.size(), true, true);
        if (n < 0) return 1;
        toks.resize(n);
        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = toks[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, batch) != 0) return 1;
        const float *e = llama_get_embeddings_seq(ctx, 0);
        if (!e) return 1;
        std::vector<float> norm(n_embd);
        common_embd_normalize(e, norm.data(), n_embd, 2);
        printf("tokens=");
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", toks[i]);
        words("raw", e, n_embd);
        words("norm", norm.data(), n_embd);
        printf("\n");
        llama_batch_free(batch);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
