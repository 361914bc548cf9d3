/*
 * attention_qrow_pieces.cu — the short-sequence kernels of attention_qrow.cu built for q and k
 * in pieces ([B, H, L, P, hd], P > 1: PatchTST's residual attention as the sum of its layers'
 * products). A unit of its own so the plain instances keep their registers and the two units
 * build in parallel; the kernels' text is attention_qrow.cu's.
 */
#define FG_QROW_PIECES 1
#include "attention_qrow.cu"
