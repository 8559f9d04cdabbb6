// llama.cpp's tokenization of a corpus with a GGUF's vocabulary only (no
// weights needed): model-only, no specials parsed, no BOS, as `goldens`
// does. Built like ../shared/scripts/llama-cpp/build.sh builds its harnesses:
//   g++ -O2 -std=c++17 llamacpp_tokenize.cpp -I $L/src/include -I $L/src/ggml/include \
//       -L $L/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o tokenize
// Usage: tokenize VOCAB.gguf CORPUS.txt > out.json   (one text per line, \n escaped as \\n)
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
static std::string unesc(const std::string &s) { std::string o; for (size_t i = 0; i < s.size(); i++) { if (s[i] == '\\' && i + 1 < s.size() && s[i+1] == 'n') { o += '\n'; i++; } else if (s[i] == '\\' && i + 1 < s.size() && s[i+1] == 't') { o += '\t'; i++; } else o += s[i]; } return o; }
static std::string jstr(const std::string &s) { std::string o = "\""; for (unsigned char c : s) { if (c == '"') o += "\\\""; else if (c == '\\') o += "\\\\"; else if (c == '\n') o += "\\n"; else if (c == '\t') o += "\\t"; else if (c < 0x20) { char b[8]; snprintf(b, 8, "\\u%04x", c); o += b; } else o += c; } return o + "\""; }
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params(); mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab *v = llama_model_get_vocab(model);
    printf("{\"tokenization\": [");
    std::ifstream c(argv[2]); std::string line; bool first = true;
    while (std::getline(c, line)) {
        std::string t = unesc(line);
        std::vector<llama_token> ids(t.size() + 16);
        int n = llama_tokenize(v, t.c_str(), t.size(), ids.data(), ids.size(), false, false);
        ids.resize(n < 0 ? 0 : n);
        printf("%s\n {\"text\": %s, \"ids\": [", first ? "" : ",", jstr(t).c_str()); first = false;
        for (size_t i = 0; i < ids.size(); i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("]}");
    }
    printf("]}\n");
    llama_model_free(model);
    return 0;
}
