// llama.cpp's quantizer for the types the shared harness leaves out (the
// low-bit k-quant mixes users download). Requantizing is allowed: the
// runtime benchmark makes these from the shipped Q4_1 file, for speed
// figures only. Usage: lmt-quantize IN.gguf OUT.gguf q2_k|q3_k_s|q3_k_m|q3_k_l|q5_k_m|q6_k
#include "llama.h"
#include <cstdio>
#include <cstring>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN.gguf OUT.gguf TYPE\n", argv[0]);
        return 2;
    }
    const struct { const char *name; llama_ftype ftype; } types[] = {
        {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},     {"q3_k_s", LLAMA_FTYPE_MOSTLY_Q3_K_S},
        {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"q3_k_l", LLAMA_FTYPE_MOSTLY_Q3_K_L},
        {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
    };
    llama_backend_init();
    auto p = llama_model_quantize_default_params();
    p.allow_requantize = true;
    p.nthread = 2;
    for (const auto &t : types) {
        if (!strcmp(t.name, argv[3])) {
            p.ftype = t.ftype;
            return llama_model_quantize(argv[1], argv[2], &p);
        }
    }
    fprintf(stderr, "unknown type %s\n", argv[3]);
    return 2;
}
