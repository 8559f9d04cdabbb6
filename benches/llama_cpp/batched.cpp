// llama.cpp's batched greedy decode, the baseline of lmt's `Decoder::append_batch` in
// benches/runtime.rs: N_SEQ sequences (TEXT plus one distinct token each, prefilled
// together), then STEPS passes of one token per sequence, every sequence its own KV
// sequence id. Prints the decode rate in tokens/s over all sequences.
// Built by benches/runtime.rs against ../shared/scripts/llama-cpp/build.sh's library.
// Usage: batched MODEL.gguf N_SEQ [STEPS=32] [N_THREADS=2] [TEXT]
#include "llama.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The first index of the largest logit: the largest value by sixteen
// running maxima (a loop the compiler vectorises), then its first place
// (lmt's side does the same, benches/runtime.rs).
static llama_token argmax(const float *lg, int n_vocab) {
    float m[16];
    for (int i = 0; i < 16; i++) m[i] = -INFINITY;
    int j = 0;
    for (; j + 16 <= n_vocab; j += 16)
        for (int i = 0; i < 16; i++) m[i] = lg[j + i] > m[i] ? lg[j + i] : m[i];
    float top = -INFINITY;
    for (; j < n_vocab; j++) top = lg[j] > top ? lg[j] : top;
    for (int i = 0; i < 16; i++) top = m[i] > top ? m[i] : top;
    for (j = 0; j < n_vocab; j++) if (lg[j] == top) return j;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: batched MODEL.gguf N_SEQ [STEPS] [N_THREADS] [TEXT]\n"); return 2; }
    const char *path = argv[1];
    int n_seq = atoi(argv[2]);
    int steps = argc > 3 ? atoi(argv[3]) : 32;
    int n_threads = argc > 4 ? atoi(argv[4]) : 2;
    const char *text = argc > 5 ? argv[5] : "The capital of France is";
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_seq_max = n_seq;
    cp.n_threads = n_threads; cp.n_threads_batch = n_threads;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> prompt(4096);
    int np = llama_tokenize(vocab, text, strlen(text), prompt.data(), prompt.size(), false, false);
    prompt.resize(np);
    // The prompts: TEXT then token 100 + s, as lmt's bench does.
    llama_batch batch = llama_batch_init(n_seq * (np + 1), 0, 1);
    batch.n_tokens = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i <= np; i++) {
            int k = batch.n_tokens++;
            batch.token[k] = i < np ? prompt[i] : 100 + s;
            batch.pos[k] = i;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = s;
            batch.logits[k] = i == np;
        }
    }
    if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
    std::vector<llama_token> next(n_seq);
    for (int s = 0; s < n_seq; s++) next[s] = argmax(llama_get_logits_ith(ctx, s * (np + 1) + np), n_vocab);
    double t0 = now();
    for (int step = 0; step < steps; step++) {
        batch.n_tokens = n_seq;
        for (int s = 0; s < n_seq; s++) {
            batch.token[s] = next[s];
            batch.pos[s] = np + 1 + step;
            batch.n_seq_id[s] = 1;
            batch.seq_id[s][0] = s;
            batch.logits[s] = 1;
        }
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        for (int s = 0; s < n_seq; s++) next[s] = argmax(llama_get_logits_ith(ctx, s), n_vocab);
    }
    double t = now() - t0;
    printf("llama.cpp batched %d sequences x %d steps: %.3fs = %.1f tok/s\n", n_seq, steps, t, n_seq * steps / t);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
