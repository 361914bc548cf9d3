/*
 * sm90.cuh — Hopper's (sm_90a) asynchronous machinery for the own GEMM and flash attention
 * kernels: mbarriers, the tensor memory accelerator's 2-D tile loads and stores
 * (cp.async.bulk.tensor) and their host-side tensor maps, and warpgroup MMA (wgmma m64nNk16 for
 * N 64 / 128 / 256, f32 accumulators, operands in shared memory through 128-byte-swizzled
 * descriptors; m64n64k16 with A in registers for the attention kernels' P·V-type products;
 * m64n128k8 in TF32 with A in registers for the split f32 products of gemm_split.cu).
 * Why: the own kernels put work cuBLASLt cannot take (an activation and its slope in the
 * epilogue, g formed beside the product; attention's online softmax between its products)
 * under asynchronous products; these thin inline-PTX wrappers are all they need, without a
 * template library. Only the sm_90a target assembles wgmma; callers guard with
 * __CUDA_ARCH_FEAT_SM90_ALL.
 */
#ifndef FG_CUDA_SM90_CUH
#define FG_CUDA_SM90_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

__device__ __forceinline__ uint32_t sm90_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarriers (shared::cta, 64-bit) */
__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm90_smem(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm90_smem(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm90_smem(b)) : "memory");
}
/* waits until the phase of parity `parity` has completed */
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(sm90_smem(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA: one 2-D box of a tensor map into shared memory, completing on an mbarrier
   (c0: the innermost coordinate, in elements; rows and columns past the tensor read as zeros) */
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
                     sm90_smem(dst)),
                 "l"((uint64_t)map), "r"(sm90_smem(bar)), "r"(c0), "r"(c1)
                 : "memory");
}
/* one 2-D box of shared memory to a tensor map's tensor (rows and columns past it are not
   written); the writing threads fence (tma_store_fence) and synchronize before the store */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"((uint64_t)map),
                 "r"(sm90_smem(src)), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until at most N committed stores still read their shared memory */
template <int N> __device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void tma_store_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* 16 bytes of shared memory through a generic pointer into it (a pointer rounded up as an
   integer no longer tells the compiler its space: it would issue a generic load) */
__device__ __forceinline__ uint4 lds128(const void *p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(sm90_smem(p)));
    return v;
}

/* ---- flags between blocks: a producer's generic stores made visible (release, gpu scope) and
   a consumer that acquires the flag before it reads that memory by TMA (the async proxy,
   hence the proxy fence on both sides) */
__device__ __forceinline__ int flag_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void flag_release(int *p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_proxy_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

/* ---- host: the tensor map of a row-major [rows, cols] f16 / bf16 tensor, read or written in
   boxes of box_rows × 64 columns with 128-byte swizzling (each box row one 128-byte line);
   false when the driver has no encoder or refuses (e.g. a base not 16-byte aligned, a row
   stride not a multiple of 16 bytes) */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

/* the common form: a row-major [rows, cols] tensor of `type` (elem_bytes each) with row stride
   `ld` elements, in boxes of box_rows × one 128-byte line of columns */
static inline bool tma_map_2d_lines(CUtensorMap *m, const void *base, CUtensorMapDataType type, int elem_bytes,
                                    int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc) return false;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * elem_bytes};
    cuuint32_t box[2] = {(cuuint32_t)(128 / elem_bytes), (cuuint32_t)box_rows}, es[2] = {1, 1};
    return enc(m, type, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static inline bool tma_map_2d(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int box_rows, bool bf16) {
    return tma_map_2d_lines(m, base, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, rows,
                            cols, cols, box_rows);
}

/* the tensor map of a row-major [rows, cols] f32 tensor with row stride `ld`
   elements (a multiple of 4), read in boxes of box_rows × 32 columns (one 128-byte line a row)
   with 128-byte swizzling; false when the driver has no encoder or refuses */
static inline bool tma_map_2d_f32(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld,
                                  int box_rows) {
    return tma_map_2d_lines(m, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, rows, cols, ld, box_rows);
}

/* ---- wgmma */
/* A shared-memory matrix descriptor for a tile TMA wrote with 128-byte swizzling: rows of 128
   bytes, 8-row groups 1024 bytes apart (the tile 1024-byte aligned). K-major operands step
   along K by adding the byte offset >> 4 to the descriptor. */
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void *tile) {
    return (uint64_t)((sm90_smem(tile) & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}
/* The same for an MN-major (transposed) tile: TMA boxes of 64 MN-contiguous elements (one
   128-byte row) × 64 K rows, 8-row K groups 1024 bytes apart (the stride byte offset) and
   successive 64-element MN chunks `chunk_bytes` apart (the leading byte offset); stepping 16 K
   rows adds 2048 bytes. */
__device__ __forceinline__ uint64_t wgmma_desc_mn_sw128(const void *tile, uint32_t chunk_bytes) {
    return (uint64_t)((sm90_smem(tile) & 0x3FFFF) >> 4) | (uint64_t)((chunk_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accumulator reads / writes across the asynchronous MMA */
__device__ __forceinline__ void acc_fence(float *d, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* The accumulator operand lists of wgmma m64nNk16 (f32: N/2 registers a thread), and the one
   instruction: after the N/2 accumulators come da, db (%N/2, %N/2+1), the scale-d predicate's
   source (%N/2+2) and the two transpose immediates (%N/2+3, %N/2+4), numbered in OPS / PRED. */
#define FG_WGMMA(SHAPE, TY, REGS, PRED, OPS, DLIST)                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32." TY \
                 "." TY " " REGS ", " OPS ";\n}\n"                                                           \
                 : DLIST                                                                                     \
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB))
#define FG_WGMMA_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FG_WGMMA_D64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FG_WGMMA_R128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FG_WGMMA_D128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FG_WGMMA_R256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FG_WGMMA_D256 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* D[64 × N] (+)= A[64 × 16] · B[16 × N] for the warpgroup, N 64 / 128 / 256; d: N / 2 f32 a
   thread (row 16·warp + lane / 4 (+ 8), columns 8i + 2·(lane % 4) (+ 1): d[4i + 2h + e]). TA /
   TB: 1 when the operand's tile is MN-major (transposed) in shared memory. accumulate 0: D = A·B. */
template <int N, typename T, int TA, int TB>
__device__ __forceinline__ void wgmma_run(float *d, uint64_t da, uint64_t db, int accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_run: N is 64, 128 or 256");
    constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
    static_assert(bf || std::is_same<T, __half>::value, "wgmma_run: f16 or bf16");
    if constexpr (N == 64 && bf) FG_WGMMA("m64n64k16", "bf16", FG_WGMMA_R64, "%34", "%32, %33, p, 1, 1, %35, %36", FG_WGMMA_D64);
    else if constexpr (N == 64) FG_WGMMA("m64n64k16", "f16", FG_WGMMA_R64, "%34", "%32, %33, p, 1, 1, %35, %36", FG_WGMMA_D64);
    else if constexpr (N == 128 && bf) FG_WGMMA("m64n128k16", "bf16", FG_WGMMA_R128, "%66", "%64, %65, p, 1, 1, %67, %68", FG_WGMMA_D128);
    else if constexpr (N == 128) FG_WGMMA("m64n128k16", "f16", FG_WGMMA_R128, "%66", "%64, %65, p, 1, 1, %67, %68", FG_WGMMA_D128);
    else if constexpr (bf) FG_WGMMA("m64n256k16", "bf16", FG_WGMMA_R256, "%130", "%128, %129, p, 1, 1, %131, %132", FG_WGMMA_D256);
    else FG_WGMMA("m64n256k16", "f16", FG_WGMMA_R256, "%130", "%128, %129, p, 1, 1, %131, %132", FG_WGMMA_D256);
}

/* D[64 × 64] (+)= A[64 × 16] · B[16 × 64] with A in registers: four 32-bit registers a thread,
   warp w's rows 16w … 16w + 15 in mma.m16n8k16's A layout (a0 (row g, k 2t..2t+1), a1 (g + 8),
   a2 (g, k + 8), a3 (g + 8, k + 8)) — what an m64n64 accumulator's columns 16j … 16j + 15 give
   when packed in pairs. TB: 1 when B's tile is MN-major. */
template <typename T, int TB>
__device__ __forceinline__ void wgmma_rs64(float *d, const uint32_t *a, uint64_t db, int accumulate) {
    constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
    static_assert(bf || std::is_same<T, __half>::value, "wgmma_rs64: f16 or bf16");
#define FG_WGMMA_RS(TY)                                                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY  \
                 "." TY " " FG_WGMMA_R64 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                      \
                 : FG_WGMMA_D64                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB))
    if constexpr (bf) FG_WGMMA_RS("bf16");
    else FG_WGMMA_RS("f16");
#undef FG_WGMMA_RS
}

/* D[64 × 128] (+)= A[64 × 8] · B[8 × 128] in TF32 with A in registers: four 32-bit registers a
   thread holding TF32 values (f32 bit patterns, the low 13 mantissa bits clear), warp w's rows
   16w … 16w + 15 in mma.m16n8k8's tf32 A layout (a0 (row g, k t), a1 (g + 8, t), a2 (g, t + 4),
   a3 (g + 8, t + 4); g = lane / 4, t = lane % 4); B K-major in shared memory (TF32 has no
   transposed form), a k-step of 8 is 32 bytes along its 128-byte rows. */
__device__ __forceinline__ void wgmma_tf32_rs128(float *d, const uint32_t *a, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " FG_WGMMA_R128
                 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : FG_WGMMA_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

#endif
