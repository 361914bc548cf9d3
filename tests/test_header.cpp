// test_header.cpp — proves fastgrad.h compiles and links as C++ (no C-only syntax,
// extern "C" linkage) and that zero-initialized descriptors mean the defaults.
#include "fastgrad.h"

#include <cstdio>
#include <cstring>

int main() {
    fg_context *ctx = nullptr;
    fg_context_desc desc{};  // zero = the CPU backend with defaults
    if (fg_context_create(&desc, &ctx) != FG_OK) return 1;
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 0, 1, 0}, y[4] = {0, 0, 0, 0};
    int64_t xs[2] = {2, 3}, ws[2] = {2, 3}, ys[2] = {2, 2};
    fg_tensor tx = fg_tensor_make(x, FG_F32, 2, xs), tw = fg_tensor_make(w, FG_F32, 2, ws);
    fg_tensor ty = fg_tensor_make(y, FG_F32, 2, ys);
    fg_status s = fg_linear_forward(ctx, &tx, &tw, nullptr, &ty);
    fg_context_destroy(ctx);
    if (s != FG_OK || y[0] != 1 || y[1] != 2 || y[2] != 4 || y[3] != 5) {
        std::printf("C++: linear_forward gave %s %s\n", fg_status_string(s), fg_last_error());
        return 1;
    }
    std::printf("C++ header OK, fastgrad %u.%u.%u\n", fg_version() >> 16, (fg_version() >> 8) & 255u,
                fg_version() & 255u);
    return 0;
}
