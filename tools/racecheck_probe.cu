/*
 * racecheck_probe.cu — whether this compute-sanitizer's racecheck models a named barrier's
 * bar.arrive. act_bwd_tile_kernel (src/cuda/linear_act_bwd_tile.cu) hands its g slots between
 * warp roles the way PTX orders it: the producer writes shared memory, then bar.arrive; the
 * consumer bar.sync, then reads (and back: read, bar.arrive; bar.sync, write). PTX: "barrier.arrive
 * guarantees that when the barrier completes, prior memory accesses requested by this thread are
 * performed relative to all threads participating in the barrier". Racecheck reported hazards
 * between those reads and writes. This probe runs the same hand-over, minimal and correct
 * (probe_arrive_kernel), beside the same with bar.sync on both sides (probe_sync_kernel), under
 * racecheck: hazards on the first and none on the second mean the tool does not model bar.arrive's
 * ordering, and its reports on kernels that hand over through bar.arrive say nothing about them.
 * scripts/gpu-check.sh runs it next to tools/sanitize_ops.c.
 *
 *   nvcc -arch=sm_90a -o racecheck_probe tools/racecheck_probe.cu
 *   compute-sanitizer --tool racecheck ./racecheck_probe
 */
#include <cstdio>
#include <cuda_runtime.h>

constexpr int N = 256, ROUNDS = 4; /* elements a slot; slots handed over per launch */

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* warps 0-1 produce, warps 2-3 consume one slot a round; barrier 1: full, 2: empty */
template <bool ARRIVE> __device__ void hand_over(float *out) {
    __shared__ float slot[N];
    const int tid = threadIdx.x, warp = tid >> 5;
    if (warp < 2) {
        for (int r = 0; r < ROUNDS; r++) {
            if (r > 0) bar_sync(2, 128); /* the consumers have read the slot */
            for (int i = tid; i < N; i += 64) slot[i] = (float)(r * N + i);
            if (ARRIVE) bar_arrive(1, 128);
            else bar_sync(1, 128);
        }
    } else {
        float sum = 0.f;
        for (int r = 0; r < ROUNDS; r++) {
            bar_sync(1, 128); /* the producers have written it */
            for (int i = tid - 64; i < N; i += 64) sum += slot[(i * 7) % N];
            if (r + 1 < ROUNDS) {
                if (ARRIVE) bar_arrive(2, 128);
                else bar_sync(2, 128);
            }
        }
        out[tid - 64] = sum;
    }
}

__global__ void probe_arrive_kernel(float *out) { hand_over<true>(out); }
__global__ void probe_sync_kernel(float *out) { hand_over<false>(out); }

int main() {
    float *out = nullptr;
    if (cudaMalloc(&out, 64 * sizeof(float)) != cudaSuccess) {
        printf("racecheck_probe: no device memory\n");
        return 1;
    }
    probe_arrive_kernel<<<1, 128>>>(out);
    probe_sync_kernel<<<1, 128>>>(out);
    float host[64];
    cudaError_t e = cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
    cudaFree(out);
    /* each consumer thread summed its elements of every round: Σ_r Σ_i (r·N + (7i mod N)) */
    double want = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i += 64) want += r * N + (i * 7) % N;
    const bool ok = e == cudaSuccess && host[0] == (float)want;
    printf("racecheck_probe: %s\n", ok ? "ok" : "wrong result");
    return ok ? 0 : 1;
}
