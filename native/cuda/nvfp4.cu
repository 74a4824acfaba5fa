// NVFP4 quantize / dequantize kernels: global amax, post-RHT amax, the tiled quantization of the
// rowwise and the columnwise copy (1x16 or 16x16 blocks, RN or SR, optional RHT), and TE's
// dequantization.
//
// Source: docs/numerics.md §5 (NVFP4), §0.3 (kernel rules); TE common/cast/nvfp4/
// (quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh), common/hadamard_transform/.
//
// The copy being quantized is a logical [R, C] matrix: the rowwise copy is X [M, K], blocks along
// X's rows; the columnwise copy is X^T [K, M], whose 16-element blocks are 16-row segments of one
// column of X, with the 16-point RHT applied to each in RHT builds (the RHT chunk of column k is
// exactly that block). One kernel per input dtype quantizes both copies: a CTA loads a 128-row tile
// of X into shared memory once (coalesced 16-byte loads, 16-bit inputs kept packed), then encodes
// the tile's rowwise blocks and its column segments from there; in 2-D builds the 16x16 tile amaxes
// are reduced from the same tile. Copy modes (RHT, SR, 2-D tiles) are compile-time, from
// defines_for(config), so each kernel carries only its own path.
//
// The post-RHT amax kernel reads the same tiles as the quantize kernel. The zero padding of the scale
// tensors is nvfp4_scale_padding's, launched only for shapes that leave some (the outputs come from
// torch.empty, with or without an amax pass). A block is encoded without the per-element NaN rule and
// fixed afterwards when its NaN-propagating amax says it holds a NaN (docs/numerics.md §0.5: NaN -> +6).
//
// The rounding code (encode_block, encode_words and the nvfp4.cuh rules they call) is __host__
// __device__ so the same code can be replayed on a CPU (tests/unit/host); the quantize kernel only
// moves data between X, the shared tile and encode_words, and reads each block's encode factor from a
// per-CTA table of the same encode_factor.
// schemes: nvfp4
#include "dependent_launch.cuh"
#include "l2_policy.cuh"
#include "nvfp4.cuh"

namespace nvfp4 {

enum InDtype { IN_F32 = 0, IN_BF16 = 1, IN_F16 = 2 };

// A block of 16 input elements as loaded, before widening: fp32 bit patterns, or pairs of 16-bit
// words (element 2i in the low half), so 16-bit inputs hold half the registers while in flight.
template <int DT>
struct Raw {
    static constexpr int WORDS = DT == IN_F32 ? BLOCK : BLOCK / 2;
    u32 w[WORDS];
};

template <int DT>
NVFP4_HD u32 load_word(const void* src, i64 off) {
    if (DT == IN_F32) return f2u(static_cast<const float*>(src)[off]);
    return static_cast<const u16*>(src)[off];
}

// The 16 elements src[off + i * cs], as loaded (16-byte vector loads when contiguous: offsets are
// multiples of 16 elements and the base is 16-byte aligned; EVICT_FIRST: at L2 evict-first priority, for a pass that
// reads X only to reduce it, l2_policy.cuh).
template <int DT, bool EVICT_FIRST = false>
NVFP4_HD void load_raw(const void* src, i64 off, i64 cs, Raw<DT>& raw) {
#if defined(__CUDA_ARCH__)
    if (cs == 1) {
        const uint4* p = DT == IN_F32 ? reinterpret_cast<const uint4*>(static_cast<const float*>(src) + off)
                                      : reinterpret_cast<const uint4*>(static_cast<const u16*>(src) + off);
#pragma unroll
        for (int q = 0; q < Raw<DT>::WORDS / 4; ++q) {
            const uint4 t = EVICT_FIRST ? load_with_policy(p + q, l2_evict_first_policy()) : p[q];
            raw.w[4 * q] = t.x;
            raw.w[4 * q + 1] = t.y;
            raw.w[4 * q + 2] = t.z;
            raw.w[4 * q + 3] = t.w;
        }
        return;
    }
#endif
    if (DT == IN_F32) {
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) raw.w[i] = load_word<DT>(src, off + (i64)i * cs);
    } else {
#pragma unroll
        for (int i = 0; i < BLOCK / 2; ++i)
            raw.w[i] = load_word<DT>(src, off + (i64)(2 * i) * cs) | (load_word<DT>(src, off + (i64)(2 * i + 1) * cs) << 16);
    }
}

// The exact fp32 value of one element as loaded (load_word): fp32 bits, or a 16-bit pattern in the low half.
template <int DT>
NVFP4_HD float element_value(u32 bits) {
    if (DT == IN_F32) return u2f(bits);
    return DT == IN_BF16 ? bf16_to_f32((u16)bits) : f16_to_f32((u16)bits);
}

// Exact widening of a loaded block to fp32.
template <int DT>
NVFP4_HD void widen(const Raw<DT>& raw, float (&v)[BLOCK]) {
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) v[i] = element_value<DT>(DT == IN_F32 ? raw.w[i] : raw.w[i / 2] >> (16 * (i % 2)));
}

// A block's amax (§0.1, as block_amax) and whether the block holds a NaN: one NaN-propagating max
// chain gives both when the block has no NaN (the common case); a block with one redoes the amax.
struct AmaxNan {
    float amax;
    bool has_nan;
};

// The AmaxNan of block v from `chain`, its NaN-propagating max over |v| (NaN iff v holds a NaN), however computed:
// the chain's value, or for a block with a NaN the NaN-ignoring block_amax.
NVFP4_HD AmaxNan amax_nan_of(float chain, const float (&v)[BLOCK]) {
    AmaxNan an = {chain, is_nan(chain)};
    if (an.has_nan) an.amax = block_amax(v);  // a NaN: slow path
    return an;
}

NVFP4_HD AmaxNan block_amax_nan(const float (&v)[BLOCK]) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) a = fmax_nan(a, fabsf(v[i]));
    return amax_nan_of(a, v);
}

// The NaN-propagating chain of block_amax_nan (for amax_nan_of) for both 16-bit elements of the words w[0..N-1] at once (element 2j
// in the low half, as loaded), per half: the max and the min over the words as packed pairs (NaN-propagating; exact:
// each picks an element, subnormals kept; three operands an instruction on sm_90, VHMNMX), then max(max, -min) =
// max |v|, the sign bits cleared (a half of zeros gives +0, as the chain from +0 does). amax[h]: half h's value as
// fp32 (exact widening), NaN iff the half holds a NaN. Device only: the quantize kernel's 16-bit builds.
template <int DT>
struct Pair;  // the packed pair type of a 16-bit input (NVRTC has no <type_traits>)
template <>
struct Pair<IN_BF16> {
    using T = __nv_bfloat162;
};
template <>
struct Pair<IN_F16> {
    using T = __half2;
};

template <int DT, int N>
__device__ __forceinline__ void pair_amax_nan(const u32 (&w)[N], float (&amax)[2]) {
    using P = typename Pair<DT>::T;
    static_assert(sizeof(P) == sizeof(u32), "one pair per word");
    const P* pair = reinterpret_cast<const P*>(w);
    P hi = pair[0], lo = pair[0];
#pragma unroll
    for (int i = 1; i < N; ++i) {
        hi = __hmax2_nan(hi, pair[i]);
        lo = __hmin2_nan(lo, pair[i]);
    }
    const P m = __hmax2_nan(hi, __hneg2(lo));
    const u32 bits = *reinterpret_cast<const u32*>(&m) & 0x7FFF7FFFu;  // +0 for zeros (max(+0, -0): either sign)
    if constexpr (DT == IN_BF16) {
        amax[0] = bf16_to_f32((u16)bits);
        amax[1] = u2f(bits & 0xFFFF0000u);
    } else {
        amax[0] = f16_to_f32((u16)bits);
        amax[1] = f16_to_f32((u16)(bits >> 16));
    }
}

// ---- per-thread units ----------------------------------------------------------------------
// A unit is GROUP 16-element blocks of one thread: several independent loads in flight.
// Contiguous data (X read along its rows, whose blocks are consecutive in memory) is split into
// runs of GROUP * WARP blocks: lane l of a warp takes blocks l, l + WARP, ... of its run, so each
// load instruction of a warp reads one contiguous span and the 8-byte code stores are contiguous.
constexpr int GROUP = 4;
constexpr int WARP = 32;

NVFP4_HD i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Units needed to cover n_blocks contiguous blocks (whole warps of GROUP-block units).
NVFP4_HD i64 contiguous_units(i64 n_blocks) { return ceil_div(n_blocks, (i64)GROUP * WARP) * WARP; }

// Block j of contiguous unit `unit`.
NVFP4_HD i64 contiguous_block(i64 unit, int j) { return ((unit / WARP) * GROUP + j) * WARP + unit % WARP; }

// amax of unit `unit` of a contiguous tensor of n_blocks 16-element blocks. On the GPU, X is loaded at L2
// evict-first priority (l2_policy.cuh: the amax pass reads it only to reduce it).
template <int DT>
NVFP4_HD float amax_unit(const void* x, i64 n_blocks, i64 unit) {
    Raw<DT> raw[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        const i64 b = contiguous_block(unit, j);
        if (b < n_blocks) load_raw<DT, true>(x, b * BLOCK, 1, raw[j]);
    }
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        if (contiguous_block(unit, j) < n_blocks) {
            float v[BLOCK];
            widen<DT>(raw[j], v);
            a = fmax_nn(a, block_amax(v));
        }
    }
    return a;
}

// One copy's outputs and scale chain; data is null when the copy is not requested.
struct QuantArgs {
    i64 cols;             // C of the copy [R, C]: rowwise K, colwise M
    const float* amax_g;  // [1] global amax A_g of this copy
    u64 seed;             // SR key (STOCHASTIC builds only)
    u32 stream;           // SR stream of this copy
    u8* data;             // [R, C/2] packed codes
    u8* scale;            // [>= R, scale_stride >= C/16] UE4M3 block scales (padding: zero_scale_padding)
    i64 scale_stride;
};

// Zero the padding of one copy's scale tensor [scale_rows, scale_stride] (null: no such copy) around
// its valid [rows, nb] region: columns nb .. scale_stride-1 of rows 0 .. rows-1, then rows
// rows .. scale_rows-1 whole. Grid-stride loops (first = this thread's index, step = the grid's
// threads); nothing to do when the shape needs no padding. NUMERICS: §5.9 (padding is zero). Called by
// nvfp4_scale_padding (the tiled quantize path) and the variant quantize kernels.
NVFP4_HD void zero_scale_padding(u8* scale, i64 scale_stride, i64 scale_rows, i64 rows, i64 nb, i64 first, i64 step) {
    if (scale == nullptr) return;
    for (i64 r = first; r < rows && nb < scale_stride; r += step)
        for (i64 c = nb; c < scale_stride; ++c) scale[r * scale_stride + c] = 0;
    u8* bottom = scale + rows * scale_stride;
    for (i64 i = first; i < (scale_rows - rows) * scale_stride; i += step) bottom[i] = 0;
}

// The sign words of a block's values (nibble_signs: bit 4i + 3 of signs[i / 8] is the sign of v[i]).
NVFP4_HD void block_signs(const float (&v)[BLOCK], u32 (&signs)[2]) {
    signs[0] = nibble_signs(v);
    signs[1] = nibble_signs(v + BLOCK / 2);
}

// The 16 codes of block (r, cb) of the copy from its values v and encode factor f (§5.3), packed in two
// words (element i is nibble i % 8 of word i / 8, little-endian bytes: byte j = code[2j] | code[2j+1] << 4,
// §5.4); amax_b >= every |v[i]| (the amax the scale came from), (r, cb) only place the SR draws. has_nan: some
// v[i] is NaN. signs: v's sign words (block_signs, or the same bits from the loaded words). NUMERICS: §5.4, §5.7,
// §0.5.
template <bool SR>
NVFP4_HD void encode_words(const QuantArgs& a, float f, float amax_b, i64 r, i64 cb, bool has_nan,
                           const float (&v)[BLOCK], const u32 (&signs)[2], u32 (&word)[2]) {
    constexpr int PER_WORD = 32 / ELEM_BITS;  // 8 codes per 32-bit word
    word[0] = word[1] = 0u;
    float y[BLOCK];
    if (!SR && !has_nan && mul_rn(amax_b, f) < ELEM_LINES_BOUND) {
        // Every |y| = RN(|v| f) <= RN(amax_b f) < ELEM_LINES_BOUND (RN is monotone): the lines need no clamp.
#pragma unroll
        for (int e = 0; e < BLOCK; ++e) y[e] = mul_rn(fabsf(v[e]), f);  // NUMERICS: §5.4 |y| = |RN(x * f)|
        word[0] = e2m1_rn_word_bounded(y, signs[0]);  // NUMERICS: §0.5 e2m1_rn_not_nan, §5.4 packing
        word[1] = e2m1_rn_word_bounded(y + PER_WORD, signs[1]);
        return;
    }
#pragma unroll
    for (int e = 0; e < BLOCK; ++e) y[e] = mul_rn(v[e], f);  // NUMERICS: §5.4 y = RN(x * f)
    if (SR) {
        // NUMERICS: §5.7 - L = r * C + c in the copy's own layout; group L / 16, byte L % 4 of word (L % 16) / 4.
        // C is a multiple of 16, so the block's 16 elements l0 .. l0 + 15 are exactly group l0 / 16: one Philox
        // call, element e taking byte e % 4 of word e / 4 (e2m1_sr_word's rnd[e / 4]).
        static_assert(BLOCK == 16, "one SR group (16 elements, 4 words of one Philox call) per block");
        const u64 l0 = (u64)(r * a.cols + cb * BLOCK);  // a multiple of 16
        const U4 draw = sr_draw(l0 / BLOCK, a.stream, a.seed);
        const u32 rnd[4] = {draw.x, draw.y, draw.z, draw.w};
        word[0] = e2m1_sr_word(y, rnd);  // NUMERICS: §5.7 e2m1_sr_not_nan, §5.4 packing
        word[1] = e2m1_sr_word(y + PER_WORD, rnd + PER_WORD / 4);
    } else {  // a NaN, or some |y| >= ELEM_LINES_BOUND: clamped first
        word[0] = e2m1_rn_word(y);             // NUMERICS: §0.5 e2m1_rn_not_nan, §5.4 packing; slow path
        word[1] = e2m1_rn_word(y + PER_WORD);  // slow path
    }
    if (has_nan) {
        // NUMERICS: §0.5 e2m1_rn / §5.7 - a NaN y of either sign gives ELEM_NAN_CODE. y = RN(v * f)
        // is NaN exactly when v is: f is finite and > 0 (§5.3), so inf * f and 0 * f are not NaN.
#pragma unroll
        for (int e = 0; e < BLOCK; ++e) {
            if (!is_nan(v[e])) continue;
            const int sh = ELEM_BITS * (e % PER_WORD);
            word[e / PER_WORD] = (word[e / PER_WORD] & ~(((1u << ELEM_BITS) - 1u) << sh)) | ((u32)ELEM_NAN_CODE << sh);
        }
    }
}

// Store one block's codes at out (8 bytes, 8-byte aligned: C/2 and cb * 8 are multiples of 8) and its
// scale byte at scale_out.
NVFP4_HD void store_block(u8* out, u8* scale_out, const u32 (&word)[2], u32 scale_code) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint2*>(out) = make_uint2(word[0], word[1]);
#else
    for (int i = 0; i < 4; ++i) {
        out[i] = (u8)(word[0] >> (8 * i));
        out[4 + i] = (u8)(word[1] >> (8 * i));
    }
#endif
    *scale_out = (u8)scale_code;
}

// Encode block (r, cb) of the copy from its 16 values v, whose block amax is amax_b (docs/numerics.md
// §5.5: block_amax(v) in 1-D builds, the 16x16 tile amax in 2-D ones); has_nan: some v[i] is NaN.
// NUMERICS: §5.1-§5.4, §5.7, §5.9.
template <bool SR>
NVFP4_HD void encode_block(const QuantArgs& a, GlobalScale g, i64 r, i64 cb, float amax_b, bool has_nan,
                           const float (&v)[BLOCK]) {
    const BlockScale s = block_scale(amax_b, g);
    u32 signs[2], word[2];
    block_signs(v, signs);
    encode_words<SR>(a, s.f, amax_b, r, cb, has_nan, v, signs, word);
    store_block(a.data + r * (a.cols / 2) + cb * (BLOCK / 2), a.scale + r * a.scale_stride + cb, word, s.code);
}

// ---- the quantize tile ------------------------------------------------------------------------
// A CTA quantizes both copies of one TILE_M x Tile<DT>::COLS tile of X [M, K] at a time (tiles numbered
// k fastest; its first by block index, the later ones drawn from a counter: quantize_tiles). The tile sits
// in shared memory as TILE_M rows of
// TILE_WORDS 32-bit words: 128 bytes of X per row, 64 16-bit elements (kept packed, element 2j in
// the low half as in X) or 32 fp32 ones, loaded once with coalesced 16-byte vectors. M and K are
// multiples of 16, so a partial tile at the bottom or right edge of X still holds whole 16-row
// m-blocks and 16-column blocks: loads, rowwise blocks and column segments are guarded at that
// granularity (rows, cols: the tile's valid extent).
//
// Thread maps (t = threadIdx.x, warp w, lane l):
// - load: 16-byte chunk t % 8 of rows 16 w + (t / 8) % 4 + 4 j, j < LOAD_ITEMS, all in flight; a warp
//   reads four whole consecutive 128-byte row pieces of X per j (load_item).
// - rowwise: block b = t + QUANT_THREADS * j of the tile's TILE_M x ROW_BLOCKS blocks (row
//   b / ROW_BLOCKS, column block b % ROW_BLOCKS); a warp stores the codes of 8 (16-bit) or 16 (fp32)
//   rows, the blocks of each row contiguous.
// - colwise: word column cw = 4 w + l / 8 (one fp32 column, or a pair of 16-bit columns) and m-block
//   mb = l % 8: 8 consecutive lanes store the 8 code groups of one column (64 contiguous bytes of
//   X^T's row k) and its 8 consecutive scale bytes.
// Shared-memory layout: tile row m starts at word m * TILE_PITCH (16 bytes of padding) and holds its
// 16-byte chunk q at chunk position q ^ (m / 16). The XOR spreads the 8 m-blocks that a colwise warp
// reads at once over all 32 banks (without it, rows 16 apart share their bank); the padding moves
// each row one chunk further, so the 16-byte accesses of a quarter warp (the tile stores: one row;
// rowwise reads: 2 or 4 consecutive rows) are conflict-free as well.
constexpr int QUANT_THREADS = 256;
constexpr int TILE_M = 128;                                       // rows of X per tile
constexpr int TILE_MBLOCKS = TILE_M / BLOCK;                      // 8 m-blocks: column segments per word column
constexpr int TILE_WORDS = 32;                                    // words of X per tile row (128 bytes)
constexpr int CHUNK_WORDS = 4;                                    // one 16-byte vector
constexpr int TILE_CHUNKS = TILE_WORDS / CHUNK_WORDS;             // 8 per tile row
constexpr int TILE_PITCH = TILE_WORDS + CHUNK_WORDS;              // words per shared-memory row
constexpr int LOAD_ITEMS = TILE_M * TILE_CHUNKS / QUANT_THREADS;  // 16-byte loads per thread
constexpr int COL_WORDS_PER_WARP = WARP / TILE_MBLOCKS;           // 4 word columns per warp
static_assert(TILE_MBLOCKS == TILE_CHUNKS, "the chunk swizzle q ^ (m / 16) needs as many m-blocks as chunks");
static_assert(QUANT_THREADS / WARP * COL_WORDS_PER_WARP == TILE_WORDS, "one colwise item per thread");
static_assert(TILE_M * TILE_CHUNKS % QUANT_THREADS == 0, "whole 16-byte loads per thread");

template <int DT>
struct Tile {
    static constexpr int PER_WORD = DT == IN_F32 ? 1 : 2;                  // elements per 32-bit word
    static constexpr int COLS = TILE_WORDS * PER_WORD;                     // columns of X per tile: 32 or 64
    static constexpr int CHUNK_ELEMS = CHUNK_WORDS * PER_WORD;             // elements per 16-byte chunk
    static constexpr int ROW_BLOCKS = COLS / BLOCK;                        // rowwise blocks per tile row: 2 or 4
    static constexpr int BLOCK_CHUNKS = BLOCK / CHUNK_ELEMS;               // chunks per rowwise block: 4 or 2
    static constexpr int ROW_ITEMS = TILE_M * ROW_BLOCKS / QUANT_THREADS;  // rowwise blocks per thread: 1 or 2
    static constexpr int TILE_WORD_COLS = BLOCK / PER_WORD;                // word columns per 16x16 tile
    static_assert(TILE_WORD_COLS % COL_WORDS_PER_WARP == 0, "a warp's colwise items lie in one 16x16 tile");
};

// Tile t of X [M, K] (k fastest): its first row and column and its valid extent (multiples of 16).
struct TilePos {
    i64 m0, k0;
    int rows, cols;
};

// Shared-memory word index of word w (0 .. TILE_WORDS-1) of tile row m.
NVFP4_HD int tile_word(int m, int w) {
    return m * TILE_PITCH + ((w / CHUNK_WORDS) ^ (m / BLOCK)) * CHUNK_WORDS + w % CHUNK_WORDS;
}

// tile_word(m + D, chunk * CHUNK_WORDS) for 0 <= m < STEP and D = STEP * j, STEP a multiple of 2 * BLOCK
// larger than m... i.e. the rows a thread visits at a fixed stride: (m + D) / 16 = m / 16 + D / 16 has no
// carry between the two (m / 16 < STEP / 16, D / 16 a multiple of STEP / 16, a power of two), so it is
// m / 16 ^ D / 16 and the swizzled chunk is (chunk ^ m / 16) ^ D / 16: the per-thread part sw =
// chunk ^ m / 16 and the row base m * TILE_PITCH are computed once, each access adds a constant row offset
// and XORs a constant into sw.
template <int STEP>
NVFP4_HD int tile_word_at(int m_base, int sw, int j) {
    static_assert(STEP % (2 * BLOCK) == 0 && ((STEP / BLOCK) & (STEP / BLOCK - 1)) == 0, "carry-free row split");
    return m_base + j * STEP * TILE_PITCH + (sw ^ (j * (STEP / BLOCK))) * CHUNK_WORDS;
}

// A thread's colwise item (thread maps above): word column cw and m-block mb of the tile.
struct ColItem {
    int cw, mb;
};

NVFP4_HD ColItem col_item(unsigned thread) {
    // cw = COL_WORDS_PER_WARP * (thread / WARP) + (thread % WARP) / TILE_MBLOCKS and mb = thread % TILE_MBLOCKS, which
    // is thread / TILE_MBLOCKS and thread % TILE_MBLOCKS as a warp holds COL_WORDS_PER_WARP whole m-block groups.
    static_assert(COL_WORDS_PER_WARP * TILE_MBLOCKS == WARP, "a warp's lanes cover its word columns' m-blocks");
    return {(int)(thread / TILE_MBLOCKS), (int)(thread % TILE_MBLOCKS)};
}

// Whether the item lies in the tile's valid extent.
template <int DT>
NVFP4_HD bool col_item_in(ColItem c, const TilePos& p) {
    return c.mb * BLOCK < p.rows && c.cw * Tile<DT>::PER_WORD < p.cols;
}

// The item's 16 words: word column cw of tile rows 16 mb .. 16 mb + 15.
NVFP4_HD void col_item_words(const u32* tile, ColItem c, u32 (&words)[BLOCK]) {
    // tile_word(16 mb + i, cw) for i < 16: every row of the segment has m / 16 = mb, so one base and
    // constant row offsets i * TILE_PITCH.
    const u32* base = tile + tile_word(c.mb * BLOCK, c.cw);
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) words[i] = base[i * TILE_PITCH];
}

// Element `half` of a pair of bf16 words as the high half of an fp32 pattern (low half zero). KNOWN_HALF: the
// caller's loop over the halves is unrolled, so `half` is a constant: a shift (IMAD on the FMA pipe) or a mask;
// else one byte permute with a selector chosen by the run-time `half`.
template <bool KNOWN_HALF>
NVFP4_HD u32 bf16_half(u32 w, int half) {
#if defined(__CUDA_ARCH__)
    if constexpr (!KNOWN_HALF) return __byte_perm(w, 0u, half == 0 ? 0x1044u : 0x3244u);  // (w1 w0 0 0) or (w3 w2 0 0)
#endif
    return half == 0 ? w << 16 : w & 0xFFFF0000u;
}

// Column `half` of a colwise item, widened to fp32: words[i] is the item's word of tile row
// 16 mb + i; fp32 (half 0) takes it whole, 16-bit inputs its low (half 0) or high (half 1) element.
// KNOWN_HALF: `half` is a compile-time constant at the call (bf16_half).
template <int DT, bool KNOWN_HALF = false>
NVFP4_HD void column_values(const u32 (&words)[BLOCK], int half, float (&v)[BLOCK]) {
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        if constexpr (DT == IN_F32) {
            v[i] = u2f(words[i]);
        } else if constexpr (DT == IN_BF16) {
            v[i] = u2f(bf16_half<KNOWN_HALF>(words[i], half));  // exact: a bf16 is an fp32's high half
        } else {
            v[i] = f16_to_f32((u16)(half == 0 ? words[i] : words[i] >> 16));
        }
    }
}

// The sign words (block_signs) of both columns of a 16-bit colwise item, from its words as loaded: signs[e] for
// column e (the low halves, then the high halves). Codes word q holds rows 8q .. 8q + 7: its even rows' and its
// odd rows' sign masks (sign_masks_16), 10 instructions for a codes word of each column instead of 16 funnel
// shifts.
NVFP4_HD void column_signs_16(const u32 (&words)[BLOCK], u32 (&signs)[2][2]) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const u32* w = words + 8 * q;
        u32 even_lo, even_hi, odd_lo, odd_hi;
        sign_masks_16(w[0], w[2], w[4], w[6], even_lo, even_hi);
        sign_masks_16(w[1], w[3], w[5], w[7], odd_lo, odd_hi);
        signs[0][q] = nibble_signs_of_masks(even_lo, odd_lo);
        signs[1][q] = nibble_signs_of_masks(even_hi, odd_hi);
    }
}

// The sign words (block_signs) of a rowwise block of 16-bit elements from its words as loaded: word j holds elements
// 2j (low half) and 2j + 1 (high half), so codes word q's masks come from words 4q .. 4q + 3 (5 instructions each).
template <int DT>
NVFP4_HD void row_signs_16(const Raw<DT>& raw, u32 (&signs)[2]) {
    static_assert(DT != IN_F32, "16-bit inputs: two elements a word");
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        u32 even, odd;
        sign_masks_16(raw.w[4 * q], raw.w[4 * q + 1], raw.w[4 * q + 2], raw.w[4 * q + 3], even, odd);
        signs[q] = nibble_signs_of_masks(even, odd);
    }
}

// Dequantize block `unit` (= r * C/16 + cb) of a copy [R, C] into fp32. NUMERICS: §5.8.
NVFP4_HD void dequantize_unit(const u8* data, const u8* scale, i64 scale_stride, const float* amax_g, i64 cols,
                              float* out, i64 unit) {
    const i64 nbc = cols / BLOCK, r = unit / nbc, cb = unit % nbc;
    const float g = decode_factor(scale[r * scale_stride + cb], *amax_g);
    const u8* in = data + r * (cols / 2) + cb * (BLOCK / 2);
    float* o = out + r * cols + cb * BLOCK;
    const u32 mask = (1u << ELEM_BITS) - 1u;
#pragma unroll
    for (int j = 0; j < BLOCK / 2; ++j) {
        const u32 byte = in[j];
        o[2 * j] = mul_rn(e2m1_value(byte & mask), g);
        o[2 * j + 1] = mul_rn(e2m1_value(byte >> ELEM_BITS), g);
    }
}

// The copy modes of this build come from defines_for(config): RHT (columnwise copy of bf16 input
// only, docs/numerics.md §5.6), STOCHASTIC (§5.7), IS_2D (§5.5).
#if !defined(RHT) || !defined(STOCHASTIC) || !defined(IS_2D)
#error "nvfp4.cu needs RHT, STOCHASTIC and IS_2D (native/_compile.defines_for)"
#endif
constexpr bool kSr = STOCHASTIC != 0;
constexpr bool k2d = IS_2D != 0;
template <int DT>
struct Modes {
    static constexpr bool rht_colwise = RHT != 0 && DT == IN_BF16;
};

}  // namespace nvfp4

// ---- kernels ---------------------------------------------------------------------------------
using namespace nvfp4;

#define NVFP4_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Combine per-thread amaxes (all >= +0) into *out (and *out2 unless null) with an integer max on the
// bits (docs/numerics.md §0.1: valid because every value is >= +0): warp shuffle, then shared memory,
// one atomic per block and output.
__device__ __forceinline__ void amax_commit(float a, u32* out, u32* out2 = nullptr) {
    __shared__ u32 warp_max[32];
    u32 b = __float_as_uint(a);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xFFFFFFFFu, b, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    __syncthreads();  // a previous amax_commit of this block may still be reading warp_max
    if (lane == 0) warp_max[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = lane < n_warps ? warp_max[lane] : 0u;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xFFFFFFFFu, b, off));
        if (lane == 0) {
            atomicMax(out, b);
            if (out2 != nullptr) atomicMax(out2, b);
        }
    }
}

#define NVFP4_THREADS 256
// NVFP4_QUANT_MIN_BLOCKS (native/nvfp4.py quantize_ctas_per_sm): resident quantize CTAs per SM that the
// register allocation must allow, 3 (<= 80 registers a thread, 24 warps per SM; SR's Philox path spills at 64).
// native/nvfp4.py launches one wave of them, each walking its tiles with the
// next tile's loads in flight (quantize_tiles). A thread's blocks are unrolled where that spills on neither
// arch (quantize_tiles' COL_UNROLL / ROW_UNROLL), else encoded one after another; no build spills (ptxas -v,
// sm_90 and sm_100a: tests/unit/test_native_compile.py; benchmarks/sass_count.py prints it).
#if !defined(NVFP4_QUANT_MIN_BLOCKS)
#error "nvfp4.cu needs NVFP4_QUANT_MIN_BLOCKS (native/nvfp4.py scheme_defines)"
#endif
static_assert(QUANT_THREADS == NVFP4_THREADS, "native/nvfp4.py launches NVFP4_THREADS-thread CTAs");

// Load a tile of X into shared memory (layout: see tile_word); only the valid rows x cols part
// (multiples of 16) is read and written. Thread t copies chunk q = t % 8 of tile rows m + j * LOAD_ROW_STEP
// (j < LOAD_ITEMS), m = 16 (t / 32) + (t / 8) % 4: a warp reads four whole consecutive 128-byte row pieces
// of X per step, all in the m-block of its warp, so the swizzled chunk q ^ (m / 16) is the same in all of
// the thread's rows and its shared words are one base (load_word) plus constant row offsets.
constexpr int LOAD_ROW_STEP = WARP / TILE_CHUNKS;  // 4 tile rows between a thread's loads
static_assert(LOAD_ROW_STEP * LOAD_ITEMS == BLOCK && QUANT_THREADS / WARP == TILE_MBLOCKS,
              "a thread's loads lie in the m-block of its warp");

struct LoadItem {
    int m, q;  // first tile row, chunk
};

NVFP4_HD LoadItem load_item(unsigned t) {
    return {(int)(BLOCK * (t / WARP) + (t / TILE_CHUNKS) % LOAD_ROW_STEP), (int)(t % TILE_CHUNKS)};
}

// tile_word of the item's first chunk; its chunk j is j * LOAD_ROW_STEP * TILE_PITCH words further (same m-block).
NVFP4_HD int load_word(LoadItem l) { return tile_word(l.m, l.q * CHUNK_WORDS); }

// Whether chunk j of the item lies in the tile's valid extent.
template <int DT>
NVFP4_HD bool load_in(LoadItem l, int j, int rows, int cols) {
    return l.m + j * LOAD_ROW_STEP < rows && l.q * Tile<DT>::CHUNK_ELEMS < cols;
}

// One 16-byte cp.async (sm_80+) from global src to shared dst: the copy lands in shared memory without passing
// through registers, so a CTA can have the next tile in flight while it encodes one. Visible to the CTA after
// copy_async_wait_all and a __syncthreads. .ca (through L1), not .cg (L2 only): with .cg the L2 saw 2.76 M read
// requests and 2.79 M repeated sector lookups for X's 4.19 M sectors at 8192^2 bf16, with .ca 1.05 M requests of
// whole 128-byte lines and none repeated; the L2 sits at 86% of its throughput in this kernel, and the given-amax
// pass went 76.0 -> 72.1 us on an H200 (docs/performance.md §4.4).
__device__ __forceinline__ void copy_async16(u32* dst, const char* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

// Wait until this thread's cp.async copies have landed (cp.async.wait_all: commit, then wait for every group).
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Start the copies of the load item's chunks of a tile (cp.async, the load map above): src points at the item's
// first chunk in X, step is the bytes between its chunks, dst = tile + load_word(l); only the chunks in the tile's
// valid extent (rows x cols) are copied.
template <int DT>
__device__ __forceinline__ void load_tile_async(const char* __restrict__ src, i64 step, LoadItem l, int rows, int cols,
                                                u32* dst) {
    using T = Tile<DT>;
    if (rows == TILE_M && cols == T::COLS) {  // a whole tile (all but the bottom and right edges): no guards
#pragma unroll
        for (int j = 0; j < LOAD_ITEMS; ++j) copy_async16(dst + j * LOAD_ROW_STEP * TILE_PITCH, src + j * step);
        return;
    }
#pragma unroll
    for (int j = 0; j < LOAD_ITEMS; ++j)
        if (load_in<DT>(l, j, rows, cols)) copy_async16(dst + j * LOAD_ROW_STEP * TILE_PITCH, src + j * step);  // edge tile
}

// NUMERICS: §5.2-§5.3 as block_scale, the encode factor read from a table of encode_factor over every
// scale code (the same function of the code and S_dec, computed once per CTA).
__device__ __forceinline__ BlockScale table_scale(float amax_b, GlobalScale g, const float* factor) {
    BlockScale s;
    s.code = block_scale_code(amax_b, g);
    s.f = factor[s.code & (SCALE_CODES - 1u)];
    return s;
}

// Unsigned 32-bit division by a divisor k >= 1 fixed for a kernel: m = floor(2^32 / k) (2^32 - 1 for k = 1) once,
// then q = umulhi(d, m) is the quotient or one below it (d m / 2^32 > d / k - 1 for d < 2^32), fixed by one compare:
// a multiply-high and 4 short instructions instead of the generic division's reciprocal (I2F, MUFU.RCP, F2I) in the
// drawing thread's chain at every step's end.
struct DivBy {
    u32 k, m;
    __device__ explicit DivBy(u32 divisor)
        : k(divisor), m(divisor == 1u ? 0xFFFFFFFFu : (u32)((1ull << 32) / divisor)) {}
    __device__ void divmod(u32 d, u32& q, u32& r) const {
        q = __umulhi(d, m);
        r = d - q * k;
        if (r >= k) {
            ++q;
            r -= k;
        }
    }
};

// The quantize tiles of X [M, K] (TILE_M rows x `cols` columns, row-major; native/nvfp4.py tile_count): tiles_k a
// row of tiles, n_tiles in all, and tile t's (tile row, tile column) by one multiply-high (`at`). 32-bit counts:
// tile_count refuses M or K >= 2^32 and n_tiles >= 2^31.
struct TileGrid {
    u32 tiles_k, n_tiles;
    DivBy by_k;
    __device__ TileGrid(u32 m32, u32 k32, u32 cols)
        : tiles_k(ceil_div(k32, cols)), n_tiles(ceil_div(m32, (u32)TILE_M) * tiles_k), by_k(tiles_k) {}
    __device__ void at(u32 t, u32& tile_row, u32& tile_col) const { by_k.divmod(t, tile_row, tile_col); }
};

// Quantize the rowwise copy (row.data non-null) and/or the columnwise copy (col.data non-null) of
// X [M, K], one tile per CTA and loop step (see "the quantize tile" above for the maps and layout).
// Addressing: every load and store address is a base plus a 32-bit row or column index of X (the tile's plus the
// thread's: its load chunk, rowwise block, colwise item) times a 64-bit extent (a row index times an extent can
// pass 2^32): one wide multiply-add per address and tile, no per-thread 64-bit offsets kept across the loop.
// Tile order: a CTA's first tile is blockIdx.x, each later one is drawn from a per-call counter (*drawn, zeroed
// before the launch): tile gridDim.x + atomicAdd(drawn, 1), so the CTAs of an SM, which the warp schedulers do not
// serve evenly, finish together instead of one running alone at the end with a quarter of the warps (static
// grid-stride tiles: 15-16 a CTA at 8192^2). The result does not depend on which CTA encodes a tile. Thread 0 draws
// the tile after next during a step and publishes its (row, column) in shared memory before the step ends.
// Pipelining: the shared tile is double-buffered. A CTA starts its first tile's copies (cp.async) before its
// setup (the global scales, which wait on A_g, and the encode-factor table); each loop step waits for its
// tile, passes ONE barrier (the tile is complete, the next tile's position is published, and every thread is
// done with the other buffer, which the previous step encoded), starts the next tile's copies into the other
// buffer, then encodes. So the next tile's DRAM reads overlap this tile's encode; the bytes in shared memory are
// those of the one-buffer walk.
template <int DT>
__device__ __forceinline__ void quantize_tiles(const void* __restrict__ x, i64 m_rows, i64 k_cols, const QuantArgs& row,
                                               const QuantArgs& col, u32* __restrict__ drawn) {
    using T = Tile<DT>;
    constexpr int ELEM_BYTES = DT == IN_F32 ? 4 : 2;
    constexpr int ROW_STEP = QUANT_THREADS / T::ROW_BLOCKS;  // tile rows between a thread's rowwise blocks
    // The blocks of a thread's colwise item and its rowwise blocks: unrolled wherever that spills on neither sm_90
    // nor sm_100a at the 80-register cap (ptxas -v), else one after another: the columns but for SR with RHT or a
    // 16-bit input (bf16 SR's unrolled columns spill 28 bytes on sm_90, 24 on sm_100a, since a block's one Philox call
    // hands out all four words, §5.7), the rows but for SR without RHT (bf16 RHT + SR unrolls its rows, not its
    // columns).
    constexpr int COL_UNROLL = kSr && (Modes<DT>::rht_colwise || DT != IN_F32) ? 1 : T::PER_WORD;
    constexpr int ROW_UNROLL = kSr && !Modes<DT>::rht_colwise ? 1 : T::ROW_ITEMS;
    static_assert(!(k2d && Modes<DT>::rht_colwise), "RHT is never 2-D (§5.6): encode_words' amax_b bounds the RHT outputs");
    __shared__ __align__(16) u32 tiles[2][TILE_M * TILE_PITCH];  // double buffer: encode one, load the other
    __shared__ u32 tile_amaxes[2][TILE_MBLOCKS][T::ROW_BLOCKS];  // 2-D: fp32 bits of each 16x16 tile's amax
    __shared__ float factor[2][SCALE_CODES];                     // encode_factor of every scale code: row, col
    const int lane = threadIdx.x % WARP;
    const ColItem item = col_item(threadIdx.x);
    const int cw = item.cw, mb = item.mb;
    const int t2 = cw / T::TILE_WORD_COLS;  // its 16-column tile (2-D)
    const bool do_row = row.data != nullptr, do_col = col.data != nullptr;

    // Row and column indices of X, and tile indices, fit 32 bits (native/nvfp4.py checks M, K < 2^32 and
    // n_tiles < 2^31 before the launch): an address is a base plus a 32-bit index times a 64-bit extent (one wide
    // multiply-add and one multiply for its high half), no 64-bit index arithmetic.
    const u32 m32 = (u32)m_rows, k32 = (u32)k_cols;
    const u64 x_row_bytes = (u64)k_cols * ELEM_BYTES, half_k = (u64)k_cols / 2, half_m = (u64)m_rows / 2;
    const LoadItem ld = load_item(threadIdx.x);
    const i64 load_step = (i64)LOAD_ROW_STEP * k_cols * ELEM_BYTES;
    const int load_w = load_word(ld);
    const TileGrid tile_grid(m32, k32, T::COLS);  // thread 0 divides a drawn tile by tiles_k once a step
    if (blockIdx.x >= tile_grid.n_tiles) return;  // (the launch caps the grid at n_tiles: no CTA returns here)
    __shared__ int2 next_tile[2];            // (tile row, tile column) of the next step's tile; row -1: none
    // Tile d as (tile row, tile column), row -1 past the last tile (in the loop: thread 0 alone).
    auto tile_at = [&](u32 d) {
        u32 q, r;
        tile_grid.at(d, q, r);
        return d < tile_grid.n_tiles ? make_int2((int)q, (int)r) : make_int2(-1, 0);  // one thread
    };
    int2 tile_mk = tile_at(blockIdx.x);
    // Start the copies of tile tmk (tile row, tile column) into tiles[buf].
    auto load = [&](int buf, int2 tmk) {
        const u32 m0 = (u32)tmk.x * TILE_M, k0 = (u32)tmk.y * T::COLS;
        const int rows = (int)min(m32 - m0, (u32)TILE_M), cols = (int)min(k32 - k0, (u32)T::COLS);
        const char* src = static_cast<const char*>(x) + (u64)(m0 + ld.m) * x_row_bytes +
                          (u64)(k0 + ld.q * T::CHUNK_ELEMS) * ELEM_BYTES;  // the item's first chunk
        load_tile_async<DT>(src, load_step, ld, rows, cols, tiles[buf] + load_w);
        if (k2d && threadIdx.x < TILE_MBLOCKS * T::ROW_BLOCKS)
            tile_amaxes[buf][threadIdx.x / T::ROW_BLOCKS][threadIdx.x % T::ROW_BLOCKS] = 0u;
    };
    load(0, tile_mk);  // in flight during the setup
    // A plan launches this kernel programmatically (native/launch.py): it may start while the amax or fill_given
    // kernel before it runs. X is theirs to read only, and was complete before they let this kernel start (an amax
    // kernel is an ordinary launch, or a programmatic one after fill_given; fill_given waits for the grid before it
    // first), so the first tile's copies go first; A_g and the tile counter, which they write, are read after the
    // wait.
    wait_for_prior_grid();
    if (threadIdx.x == 0) next_tile[0] = tile_at(gridDim.x + atomicAdd(drawn, 1u));  // one thread

    GlobalScale g_row{}, g_col{};
    if (do_row) g_row = global_scale(*row.amax_g);
    if (do_col) g_col = global_scale(*col.amax_g);
    for (unsigned c = threadIdx.x; c < 2 * SCALE_CODES; c += QUANT_THREADS)  // read after the first __syncthreads
        factor[c / SCALE_CODES][c % SCALE_CODES] = encode_factor(c % SCALE_CODES, c < SCALE_CODES ? g_row : g_col);

    const int row_r = threadIdx.x / T::ROW_BLOCKS, row_cb = threadIdx.x % T::ROW_BLOCKS;  // rows row_r + j * ROW_STEP
    const i64 row_off_step = (i64)ROW_STEP * (k_cols / 2), row_soff_step = (i64)ROW_STEP * row.scale_stride;

    int buf = 0;
    for (int step = 0; tile_mk.x >= 0; ++step, buf ^= 1) {
        const u32 m0 = (u32)tile_mk.x * TILE_M, k0 = (u32)tile_mk.y * T::COLS;
        TilePos p;
        p.m0 = m0;
        p.k0 = k0;
        p.rows = (int)min(m32 - m0, (u32)TILE_M);
        p.cols = (int)min(k32 - k0, (u32)T::COLS);
        const int rows = p.rows, cols = p.cols;
        copy_async_wait_all();
        __syncthreads();  // this tile is in tiles[buf], the next one's position in next_tile[step % 2]; every
                          // thread is done with tiles[buf ^ 1] (the previous step's tile)
        tile_mk = next_tile[step & 1];
        u32 ticket = 0u;  // thread 0: the draw of the tile after next, used only at the step's end (its latency hidden)
        if (tile_mk.x >= 0) {
            load(buf ^ 1, tile_mk);
            if (threadIdx.x == 0) ticket = atomicAdd(drawn, 1u);  // one thread
        }
        const u32* tile = tiles[buf];
        u32(&tile_amax)[TILE_MBLOCKS][T::ROW_BLOCKS] = tile_amaxes[buf];

        // The colwise item's 16 words: word column cw of tile rows 16 mb .. 16 mb + 15.
        const bool col_in = col_item_in<DT>(item, p);
        u32 words[BLOCK];
        // 16-bit inputs: both columns' NaN-propagating amax chains at once (pair_amax_nan), for the colwise blocks and
        // the 2-D tile amax, or with RHT for the columns' RHT paths with their smallest non-zero exponents
        float col_amax[2];
        u32 col_elo[2];
        if ((do_col || k2d) && col_in) {
            col_item_words(tile, item, words);
            if constexpr (DT != IN_F32) pair_amax_nan<DT>(words, col_amax);
            if constexpr (Modes<DT>::rht_colwise) bf16_pair_low_exponents(words, col_elo);
        }
        if (k2d) {
            // NUMERICS: §5.5 2-D - the amax of each 16x16 tile, as §0.1 (fmax over |v| from +0, NaN
            // ignored): the item's column amaxes, then a max over the warp's 4 word columns (one
            // 16x16 tile) and, through shared memory, over the 2 (16-bit) or 4 (fp32) warps of the
            // tile, as an integer max on the bits (valid: every value is >= +0). A max taken in any
            // order is the same value, so this equals the per-tile fmax_nn chain exactly.
            float a = 0.0f;
            if (col_in) {
#pragma unroll
                for (int e = 0; e < T::PER_WORD; ++e) {
                    float c = 0.0f;
                    bool fp32_chain = true;  // fp32 inputs: the NaN-ignoring chain over the column's values
                    if constexpr (DT != IN_F32) {
                        c = col_amax[e];          // 16-bit: block_amax of column e unless it holds a NaN
                        fp32_chain = is_nan(c);  // (then the chain; slow path)
                    }
                    if (fp32_chain) {
                        float v[BLOCK];
                        column_values<DT>(words, e, v);
                        c = block_amax(v);
                    }
                    a = fmax_nn(a, c);
                }
            }
            u32 bits = f2u(a);
#pragma unroll
            for (int off = TILE_MBLOCKS; off < WARP; off <<= 1)  // lanes of one m-block: l % 8 equal
                bits = max(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, off));
            if (lane < TILE_MBLOCKS) atomicMax(&tile_amax[mb][t2], bits);
            __syncthreads();
        }

        if (do_col && col_in) {
            u32 col_signs[2][2];  // 16-bit inputs without RHT: both columns' sign words from the loaded words
            if constexpr (DT != IN_F32 && !Modes<DT>::rht_colwise) column_signs_16(words, col_signs);
            // Column k = kc + e (kc = k0 + PER_WORD * cw), m-block m0 / 16 + mb: block (k, m0 / 16 + mb) of X^T,
            // codes at col.data + k * (M/2) + (m0 / 16 + mb) * 8, scale at col.scale + k * stride + m0 / 16 + mb.
            const u32 kc = k0 + cw * T::PER_WORD;
            u8* data = col.data + (u64)kc * half_m + (m0 / 2 + mb * (BLOCK / 2));
            u8* scale = col.scale + (u64)kc * (u64)col.scale_stride + (m0 / BLOCK + mb);
#pragma unroll(COL_UNROLL)
            for (int e = 0; e < T::PER_WORD; ++e) {
                float v[BLOCK];
                column_values<DT, COL_UNROLL == T::PER_WORD>(words, e, v);
                const i64 k = kc + e, cb = m0 / BLOCK + mb;  // SR positions (§5.7)
                u32 word[2];
                BlockScale s;
                if constexpr (Modes<DT>::rht_colwise) {
                    float h[BLOCK];
                    const RhtPath path = rht_path_of(e == 0 ? col_amax[0] : col_amax[1], e == 0 ? col_elo[0] : col_elo[1]);
                    rht16(v, h, path);  // NUMERICS: §5.6 - the colwise block is the RHT chunk of column k
                    const AmaxNan an = block_amax_nan(h);
                    const float amax_b = k2d ? u2f(tile_amax[mb][t2]) : an.amax;
                    s = table_scale(amax_b, g_col, factor[1]);
                    u32 signs[2];
                    block_signs(h, signs);
                    encode_words<kSr>(col, s.f, amax_b, k, cb, an.has_nan, h, signs, word);
                } else {
                    // NUMERICS: §0.1 16-bit inputs: the same value and NaN flag as block_amax_nan(v)
                    const AmaxNan an = DT == IN_F32 ? block_amax_nan(v) : amax_nan_of(col_amax[e], v);
                    const float amax_b = k2d ? u2f(tile_amax[mb][t2]) : an.amax;
                    s = table_scale(amax_b, g_col, factor[1]);
                    u32 signs[2];
                    if constexpr (DT == IN_F32) {
                        block_signs(v, signs);
                    } else {
                        signs[0] = col_signs[e][0];
                        signs[1] = col_signs[e][1];
                    }
                    encode_words<kSr>(col, s.f, amax_b, k, cb, an.has_nan, v, signs, word);
                }
                store_block(data, scale, word, s.code);
                data += m_rows / 2;  // the next column: the next row of X^T
                scale += col.scale_stride;
            }
        }

        if (do_row) {
            // Row m0 + r, block k0 / 16 + cb: codes at row.data + (m0 + r) * (K/2) + (k0 / 16 + cb) * 8,
            // scale at row.scale + (m0 + r) * stride + k0 / 16 + cb.
            const u32 r0 = m0 + row_r;
            u8* data = row.data + (u64)r0 * half_k + (k0 / 2 + row_cb * (BLOCK / 2));
            u8* scale = row.scale + (u64)r0 * (u64)row.scale_stride + (k0 / BLOCK + row_cb);
#pragma unroll(ROW_UNROLL)
            for (int j = 0; j < T::ROW_ITEMS; ++j) {
                const int r = row_r + j * ROW_STEP, cb = row_cb;
                if (r >= rows || cb * BLOCK >= cols) break;  // r grows with j: no later block is in the tile
                Raw<DT> raw;
#pragma unroll
                for (int q = 0; q < T::BLOCK_CHUNKS; ++q) {
                    // tile_word(r, (cb * BLOCK_CHUNKS + q) * CHUNK_WORDS), r = row_r + j * ROW_STEP (row_r < ROW_STEP)
                    const int sw = (cb * T::BLOCK_CHUNKS + q) ^ (row_r / BLOCK);
                    const uint4 c = *reinterpret_cast<const uint4*>(tile + tile_word_at<ROW_STEP>(row_r * TILE_PITCH, sw, j));
                    raw.w[4 * q] = c.x;
                    raw.w[4 * q + 1] = c.y;
                    raw.w[4 * q + 2] = c.z;
                    raw.w[4 * q + 3] = c.w;
                }
                float v[BLOCK];
                widen<DT>(raw, v);
                AmaxNan an;
                u32 signs[2];
                if constexpr (DT == IN_F32) {
                    an = block_amax_nan(v);
                    block_signs(v, signs);
                } else {  // NUMERICS: §0.1 the same value and NaN flag as block_amax_nan(v), from the packed words
                    float half_amax[2];
                    pair_amax_nan<DT>(raw.w, half_amax);
                    an = amax_nan_of(fmax_nan(half_amax[0], half_amax[1]), v);
                    row_signs_16<DT>(raw, signs);
                }
                const float amax_b = k2d ? u2f(tile_amax[r / BLOCK][cb]) : an.amax;
                const BlockScale s = table_scale(amax_b, g_row, factor[0]);
                u32 word[2];
                encode_words<kSr>(row, s.f, amax_b, (i64)m0 + r, k0 / BLOCK + cb, an.has_nan, v, signs, word);
                store_block(data, scale, word, s.code);
                data += row_off_step;
                scale += row_soff_step;
            }
        }
        if (threadIdx.x == 0 && tile_mk.x >= 0) next_tile[(step + 1) & 1] = tile_at(gridDim.x + ticket);  // one thread
    }
    // This CTA's tiles are done: a kernel launched programmatically after this one (a plan's next fill_given) may
    // start as the CTAs get here; it waits for this grid's completion before it touches anything.
    allow_dependent_launch();
}

// NUMERICS: §5.9 - both copies' scale padding (zero; a copy not requested: null scale, nothing), launched only for
// a shape that leaves some (native/nvfp4.py scale_padding_launch). Its own launch, not the quantize kernel's tail:
// there the padding code made the bf16 SR builds spill at the 80-register cap (ptxas -v, sm_90 / sm_100a: 1x16 SR
// 68 / 56 bytes, 25 local loads and stores in the tile loop; docs/performance.md §4.5).
extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)
    nvfp4_scale_padding(u8* row_scale, i64 row_stride, i64 row_scale_rows, u8* col_scale, i64 col_stride,
                        i64 col_scale_rows, i64 m_rows, i64 k_cols) {
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, step = (i64)gridDim.x * blockDim.x;
    zero_scale_padding(row_scale, row_stride, row_scale_rows, m_rows, k_cols / BLOCK, first, step);
    zero_scale_padding(col_scale, col_stride, col_scale_rows, k_cols, m_rows / BLOCK, first, step);
}

// Per input dtype: amax(X) (units of GROUP blocks) into both copies' A_g slots (out2 may be null),
// and the tiled quantization of both copies (a copy whose data pointer is null is skipped; its other
// arguments are then unused).
#define NVFP4_INSTANTIATE(SUFFIX, DT)                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)                                                  \
        nvfp4_amax_##SUFFIX(const void* x, i64 m_rows, i64 k_cols, u32* out, u32* out2) {                       \
        const i64 n_blocks = m_rows * k_cols / BLOCK;                                                            \
        float a = 0.0f;                                                                                          \
        NVFP4_GRID_STRIDE(u, contiguous_units(n_blocks)) a = fmax_nn(a, amax_unit<DT>(x, n_blocks, u));         \
        allow_dependent_launch(); /* the quantize kernel's CTAs may start as these finish (it waits for A_g) */ \
        wait_for_prior_grid(); /* a plan's fill_given clears A_g first (it let this start once X was complete) */ \
        amax_commit(a, out, out2);                                                                               \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS, NVFP4_QUANT_MIN_BLOCKS) nvfp4_quantize_##SUFFIX( \
        const void* x, i64 m_rows, i64 k_cols, u64 seed, u8* row_data, u8* row_scale, i64 row_scale_stride,     \
        const float* row_amax, u32 row_stream, u8* col_data, u8* col_scale, i64 col_scale_stride,               \
        const float* col_amax, u32 col_stream, u32* drawn) {                                                     \
        const QuantArgs row = {k_cols, row_amax, seed, row_stream, row_data, row_scale, row_scale_stride};      \
        const QuantArgs col = {m_rows, col_amax, seed, col_stream, col_data, col_scale, col_scale_stride};      \
        quantize_tiles<DT>(x, m_rows, k_cols, row, col, drawn);                                                  \
    }

NVFP4_INSTANTIATE(f32, IN_F32)
NVFP4_INSTANTIATE(bf16, IN_BF16)
NVFP4_INSTANTIATE(f16, IN_F16)

// NVFP4_RHT_AMAX_MIN_BLOCKS (native/nvfp4.py RHT_AMAX_CTAS_PER_SM): resident RHT-amax CTAs per SM that the register
// allocation must allow.
#if !defined(NVFP4_RHT_AMAX_MIN_BLOCKS)
#error "nvfp4.cu needs NVFP4_RHT_AMAX_MIN_BLOCKS (native/nvfp4.py scheme_defines)"
#endif

// Post-RHT amax of the columnwise copy (bf16 X [M, K]) into *out_rht, and amax(X) into *out_plain (the rowwise
// copy's A_g, read in the same pass). NUMERICS: §5.6, §0.1. CTAs walk the quantize tiles (128 rows x 64 columns;
// tile t, t + gridDim.x, ...) and warp w takes m-block w of each: lane l holds word column l (two bf16 columns) of
// the m-block's 16 rows, read straight from X (each load instruction of a warp reads one whole 128-byte row piece),
// i.e. both columns' RHT chunks. No shared memory and no barrier: the warps of a CTA do not wait for each other.
// Per column: max |v| (NaN-propagating) from the packed words (pair_amax_nan) and its smallest non-zero exponent
// (bf16_pair_low_exponents) choose the RHT path (rht_path_of, as rht_path) and give amax(X) unless a NaN; then the
// amax of the transformed column (rht16_amax).
extern "C" __global__ void __launch_bounds__(NVFP4_THREADS, NVFP4_RHT_AMAX_MIN_BLOCKS)
    nvfp4_rht_amax(const void* x, i64 m_rows, i64 k_cols, u32* out_rht, u32* out_plain) {
    using T = Tile<IN_BF16>;
    static_assert(NVFP4_THREADS / WARP == TILE_MBLOCKS && T::COLS == 2 * WARP, "a warp per m-block, a lane per word");
    // Rows, word columns and tiles in 32 bits (native/nvfp4.py tile_count: M, K < 2^32, n_tiles < 2^31).
    const u32 m32 = (u32)m_rows, k32 = (u32)k_cols, lane = threadIdx.x % WARP, mb = threadIdx.x / WARP;
    const u32 row_words = k32 / 2;  // 32-bit words (bf16 pairs) of a row of X
    const TileGrid tile_grid(m32, k32, T::COLS);
    const u32* xw = static_cast<const u32*>(x);
    const u64 policy = l2_evict_first_policy();  // X is read only to reduce it (l2_policy.cuh)
    float a_rht = 0.0f, a_plain = 0.0f;
    for (u32 t = blockIdx.x; t < tile_grid.n_tiles; t += gridDim.x) {
        u32 tm, tk;
        tile_grid.at(t, tm, tk);
        const u32 r0 = tm * TILE_M + mb * BLOCK, wc = tk * WARP + lane;  // the lane's first row and word column
        if (r0 >= m32 || wc >= row_words) continue;  // bottom or right edge: M and K are multiples of 16
        const u32* src = xw + (u64)r0 * row_words + wc;
        u32 words[BLOCK];
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) words[i] = load_with_policy(src + (u64)i * row_words, policy);  // all in flight
        float hi[2];
        u32 e_lo[2];
        pair_amax_nan<IN_BF16>(words, hi);
        bf16_pair_low_exponents(words, e_lo);
#pragma unroll
        for (int e = 0; e < T::PER_WORD; ++e) {
            float v[BLOCK];
            column_values<IN_BF16, true>(words, e, v);
            a_plain = fmax_nn(a_plain, amax_nan_of(hi[e], v).amax);  // NUMERICS: §0.1 - block_amax(v)
            a_rht = fmax_nn(a_rht, rht16_amax(v, rht_path_of(hi[e], e_lo[e])));
        }
    }
    allow_dependent_launch();  // the quantize kernel's CTAs may start as these finish (it waits for A_g)
    wait_for_prior_grid();     // a plan's fill_given cleared the A_g slots (X was complete before it let this start)
    amax_commit(a_rht, out_rht);
    amax_commit(a_plain, out_plain);
}

extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)
    nvfp4_dequantize(const u8* data, const u8* scale, i64 scale_stride, const float* amax_g, i64 rows, i64 cols,
                     float* out) {
    NVFP4_GRID_STRIDE(u, rows * (cols / BLOCK)) dequantize_unit(data, scale, scale_stride, amax_g, cols, out, u);
}

// ---- NVFP4 variants: 4over6 and row-scaled (docs/numerics.md §5.10) -------------------------------
// Simple one-thread-per-unit kernels, separate from the tiled quantize kernel above: a copy [R, C] of
// X is read through strides (element (r, c) of the copy is x[r * rs + c * cs]: rowwise rs = K, cs = 1;
// colwise X^T rs = 1, cs = K), so the columnwise copy is quantized from X^T on its own (§5.10), never
// transposed from the rowwise one. The scale chain constants come from defines_for(config): with a
// 4over6 variant NVFP4_GLOBAL_MAX = 6 * e4m3_max and NVFP4_RECIP_GLOBAL_MAX = fl(1 / (6 * e4m3_max))
// (native/nvfp4.py scheme_defines). The scale tensors come zero-filled from the host (§5.9 padding).
#if !defined(NVFP4_ERR_MSE) || !defined(NVFP4_MAP4_EXPAND)
#error "nvfp4.cu needs NVFP4_ERR_MSE and NVFP4_MAP4_EXPAND (native/nvfp4.py scheme_defines)"
#endif

namespace nvfp4 {

constexpr bool kMse = NVFP4_ERR_MSE != 0;

// One copy [rows, cols] of X, read through strides.
struct CopySrc {
    const void* x;
    i64 rows, cols, rs, cs;
};

// Block (r, cb) of the copy (16 elements along its row), widened exactly to fp32.
template <int DT>
NVFP4_HD void copy_block(const CopySrc& s, i64 r, i64 cb, float (&v)[BLOCK]) {
    Raw<DT> raw;
    load_raw<DT>(s.x, r * s.rs + cb * BLOCK * s.cs, s.cs, raw);  // cs = 1: 16-element aligned vector loads
    widen<DT>(raw, v);
}

// Store a block's 16 packed codes (two words, element 2j in the low nibble of byte j; §5.4).
NVFP4_HD void store_codes(u8* data, i64 cols, i64 r, i64 cb, const u32 (&word)[2]) {
    u8* out = data + r * (cols / 2) + cb * (BLOCK / 2);
    for (int i = 0; i < 4; ++i) {
        out[i] = (u8)(word[0] >> (8 * i));
        out[4 + i] = (u8)(word[1] >> (8 * i));
    }
}

// NUMERICS: §5.3 f = fmin(RN(1 / RN(float(s_blk) * S_dec)), FLT_MAX); s_blk = 0 -> FLT_MAX (as block_scale).
NVFP4_HD float four6_encode_factor(u32 code, float s_dec) {
    return code == 0 ? flt_max() : fmin_nn(rcp_rn(mul_rn(ue4m3_value(code), s_dec)), flt_max());
}

struct Four6Scales {
    u32 map4, map6;  // UE4M3 bits of the two candidates
};

// NUMERICS: §5.10 - base = RN(RN(A_b / 6) * S_enc) (a true division, unlike §5.2);
// map4 = sat_e4m3(fmin(RN(1.5 * base), 448)), map6 = sat_e4m3(fmin(base, 448)). A_b >= 0 and not NaN
// (NaN-ignoring amax), S_enc finite > 0: base is >= 0 and not NaN, as sat_e4m3 needs.
NVFP4_HD Four6Scales four6_scales(float amax_b, float s_enc) {
    const float base = mul_rn(div_rn(amax_b, ELEM_MAX), s_enc);
    Four6Scales s;
    s.map4 = sat_e4m3(fmin_nn(mul_rn(base, NVFP4_MAP4_EXPAND), SCALE_MAX));
    s.map6 = sat_e4m3(fmin_nn(base, SCALE_MAX));
    return s;
}

// One candidate of one block: its packed codes and its error.
struct Four6Cand {
    u32 word[2];
    float err;
};

// Codes of v under block scale `code` (§5.3 f, §5.4 y = RN(x * f), e2m1_rn with NaN -> 0x7), and the
// candidate error. NUMERICS: §5.10 - for elements 0..15 in order, every step RN (no contraction):
// val = RN(RN(RN(v_e2m1 * sf) * A_g) / (6 * e4m3_max)) (true division), d = RN(val - x),
// err = RN(err + |d|) (mae) or RN(err + RN(d * d)) (mse), from err = +0.
NVFP4_HD Four6Cand four6_candidate(const float (&v)[BLOCK], u32 code, float s_dec, float amax_g) {
    const float f = four6_encode_factor(code, s_dec);
    const float sf = ue4m3_value(code);
    Four6Cand c;
    c.word[0] = c.word[1] = 0u;
    c.err = 0.0f;
#pragma unroll
    for (int e = 0; e < BLOCK; ++e) {
        const u32 q = e2m1_rn(mul_rn(v[e], f));
        c.word[e / 8] |= q << (ELEM_BITS * (e % 8));
        const float val = div_rn(mul_rn(mul_rn(e2m1_value(q), sf), amax_g), NVFP4_GLOBAL_MAX);
        const float d = add_rn(val, -v[e]);  // RN(val - x): negation is exact
        c.err = add_rn(c.err, kMse ? mul_rn(d, d) : fabsf(d));
    }
    return c;
}

// NUMERICS: §5.10 - 4over6 of 1x16 block (r, cb): A_b = amax of the block (§0.1, NaN ignored);
// map4 iff err4 < err6 (ties, NaN and inf = inf go to map6). amax_g: this row's A_g (row-scaled) or
// the tensor's.
template <int DT>
NVFP4_HD void four6_block(const CopySrc& s, float amax_g, i64 r, i64 cb, u8* data, u8* scale, i64 scale_stride) {
    float v[BLOCK];
    copy_block<DT>(s, r, cb, v);
    const GlobalScale g = global_scale(amax_g);  // NUMERICS: §5.1 with 6 * e4m3_max (§5.10)
    const Four6Scales sc = four6_scales(block_amax(v), g.s_enc);
    const Four6Cand c4 = four6_candidate(v, sc.map4, g.s_dec, amax_g);
    const Four6Cand c6 = four6_candidate(v, sc.map6, g.s_dec, amax_g);
    const bool pick4 = c4.err < c6.err;
    store_codes(data, s.cols, r, cb, pick4 ? c4.word : c6.word);
    scale[r * scale_stride + cb] = (u8)(pick4 ? sc.map4 : sc.map6);
}

// NUMERICS: §5.10 - 4over6 of the 16x16 tile (rows 16 tr .. 16 tr + 15, block column cb) of the copy:
// A_b = the tile amax (§5.5), each row's candidate error as four6_candidate, the 16 row errors summed
// as a tree (row j + row j+8, then + 4, + 2, + 1, each RN; TE's warp reduction), one winner per tile.
// The copy's rows are its own: for the columnwise copy these are the rows of X^T (the transposed
// tile), so its sums differ in order from the rowwise copy's.
template <int DT>
NVFP4_HD void four6_tile(const CopySrc& s, float amax_g, i64 tr, i64 cb, u8* data, u8* scale, i64 scale_stride) {
    const i64 r0 = tr * BLOCK;
    float amax_t = 0.0f;
    for (int j = 0; j < BLOCK; ++j) {
        float v[BLOCK];
        copy_block<DT>(s, r0 + j, cb, v);
        amax_t = fmax_nn(amax_t, block_amax(v));  // NUMERICS: §0.1 exact in any order
    }
    const GlobalScale g = global_scale(amax_g);
    const Four6Scales sc = four6_scales(amax_t, g.s_enc);
    float e4[BLOCK], e6[BLOCK];
    for (int j = 0; j < BLOCK; ++j) {
        float v[BLOCK];
        copy_block<DT>(s, r0 + j, cb, v);
        e4[j] = four6_candidate(v, sc.map4, g.s_dec, amax_g).err;
        e6[j] = four6_candidate(v, sc.map6, g.s_dec, amax_g).err;
    }
#pragma unroll
    for (int h = BLOCK / 2; h > 0; h >>= 1) {  // NUMERICS: §5.10 tree offsets 8, 4, 2, 1
#pragma unroll
        for (int j = 0; j < h; ++j) {
            e4[j] = add_rn(e4[j], e4[j + h]);
            e6[j] = add_rn(e6[j], e6[j + h]);
        }
    }
    const bool pick4 = e4[0] < e6[0];
    const u32 code = pick4 ? sc.map4 : sc.map6;
    for (int j = 0; j < BLOCK; ++j) {
        float v[BLOCK];
        copy_block<DT>(s, r0 + j, cb, v);
        const Four6Cand c = four6_candidate(v, code, g.s_dec, amax_g);
        store_codes(data, s.cols, r0 + j, cb, c.word);
        scale[(r0 + j) * scale_stride + cb] = (u8)code;
    }
}

// NUMERICS: §0.1 amax of row r of the copy: fmax over |v| from +0 (NaN ignored, +inf kept), exact in
// any order; the row-scaled A_g of that row (§5.10). The host replay's; nvfp4_row_amax spreads a row over a
// warp (row_amax_of_rows, row_amax_of_columns), the same value in another order.
template <int DT>
NVFP4_HD float copy_row_amax(const CopySrc& s, i64 r) {
    float a = 0.0f;
    for (i64 cb = 0; cb < s.cols / BLOCK; ++cb) {
        float v[BLOCK];
        copy_block<DT>(s, r, cb, v);
        a = fmax_nn(a, block_amax(v));
    }
    return a;
}

}  // namespace nvfp4

// One copy of X [M, K] for the variant kernels: the rowwise copy is X [M, K] (row stride K), the columnwise
// one X^T [K, M] read through strides (row stride 1, column stride K); data == nullptr: not requested.
// amax: the copy's A_g, [1] or [rows] (row-scaled); scale: [scale_rows, scale_stride], padding zeroed here.
struct VariantCopy {
    CopySrc src;
    u8* data;
    u8* scale;
    i64 scale_stride, scale_rows;
    float* amax;
};

// The parameters of both copies, rowwise first (native/nvfp4.py `_variant_copies`).
#define NVFP4_VARIANT_PARAMS                                                                          \
    const void *x, i64 m, i64 k, u8 *r_data, u8 *r_scale, i64 r_stride, i64 r_scale_rows, float *r_amax, \
        u8 *c_data, u8 *c_scale, i64 c_stride, i64 c_scale_rows, float *c_amax
#define NVFP4_VARIANT_COPIES                                                                          \
    const VariantCopy row_copy = {{x, m, k, k, 1}, r_data, r_scale, r_stride, r_scale_rows, r_amax}; \
    const VariantCopy col_copy = {{x, k, m, 1, k}, c_data, c_scale, c_stride, c_scale_rows, c_amax}

// Units of both copies in one grid-stride loop over i, the rowwise copy's first: per_copy(copy) units of
// each requested copy. NVFP4_VARIANT_UNIT then names the copy `c` of unit i (a copy by value, selected field
// by field: an indexed pair would live in local memory) and its unit `u` in that copy.
#define NVFP4_VARIANT_UNITS(i, per_copy)                                 \
    const i64 n_row_ = row_copy.data ? (i64)(per_copy(row_copy)) : 0;    \
    const i64 n_col_ = col_copy.data ? (i64)(per_copy(col_copy)) : 0;    \
    NVFP4_GRID_STRIDE(i, n_row_ + n_col_)
#define NVFP4_VARIANT_UNIT(i, c, u)                                \
    const bool col_ = i >= n_row_;                                \
    const VariantCopy c = pick_copy(col_, row_copy, col_copy);    \
    const i64 u = col_ ? i - n_row_ : i

// `col ? b : a`, field by field (register selects; a whole-struct select went through local memory).
__device__ __forceinline__ VariantCopy pick_copy(bool col, const VariantCopy& a, const VariantCopy& b) {
    return {{a.src.x, col ? b.src.rows : a.src.rows, col ? b.src.cols : a.src.cols, col ? b.src.rs : a.src.rs,
             col ? b.src.cs : a.src.cs},
            col ? b.data : a.data, col ? b.scale : a.scale, col ? b.scale_stride : a.scale_stride,
            col ? b.scale_rows : a.scale_rows, col ? b.amax : a.amax};
}

// Zero the scale padding of both requested copies (§5.9): the variant quantize kernels write every block.
__device__ __forceinline__ void zero_variant_paddings(const VariantCopy& row, const VariantCopy& col) {
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, step = (i64)gridDim.x * blockDim.x;
    if (row.data)
        zero_scale_padding(row.scale, row.scale_stride, row.scale_rows, row.src.rows, row.src.cols / BLOCK, first, step);
    if (col.data)
        zero_scale_padding(col.scale, col.scale_stride, col.scale_rows, col.src.rows, col.src.cols / BLOCK, first, step);
}

// The row amaxes of the variant copies (row-scaled A_g, §5.10; NUMERICS: §0.1 fmax over |v| from +0, NaN ignored,
// exact in any order), a CTA per unit so that the copy is uniform in a CTA: a unit of the rowwise copy is
// ROW_AMAX_WARPS rows of X, a warp a row (its lanes take the row's 16-element blocks lane, lane + 32, ..., as
// vector loads; a warp max); a unit of the columnwise copy is WARP rows of X^T, i.e. WARP adjacent columns of X
// (lane l a column, warp w the rows of X w, w + ROW_AMAX_WARPS, ...: a warp's load reads adjacent elements of one
// row of X; the warps' maxima combined through shared memory). One thread per row of the copy, as before, left a
// 4096^2 input with 32 CTAs, latency-bound. native/nvfp4.py row_amax_units counts the units.
constexpr int ROW_AMAX_WARPS = NVFP4_THREADS / WARP;

template <int DT>
__device__ __forceinline__ void row_amax_of_rows(const CopySrc& s, float* amax, i64 unit) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const i64 r = unit * ROW_AMAX_WARPS + warp;
    if (r >= s.rows) return;  // (no barrier in this path)
    float a = 0.0f;
    for (i64 cb = lane; cb < s.cols / BLOCK; cb += WARP) {
        float v[BLOCK];
        copy_block<DT>(s, r, cb, v);
        a = fmax_nn(a, block_amax(v));
    }
    u32 b = f2u(a);  // >= +0: an integer max on the bits (§0.1)
#pragma unroll
    for (int off = WARP / 2; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xFFFFFFFFu, b, off));
    if (lane == 0) amax[r] = u2f(b);
}

template <int DT>
__device__ __forceinline__ void row_amax_of_columns(const CopySrc& s, float* amax, i64 unit) {
    __shared__ u32 part[ROW_AMAX_WARPS][WARP];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const i64 r = unit * WARP + lane;  // row r of X^T: column r of X
    float a = 0.0f;
    if (r < s.rows) {
#pragma unroll 4
        for (i64 j = warp; j < s.cols; j += ROW_AMAX_WARPS) {
            a = fmax_nn(a, fabsf(element_value<DT>(load_word<DT>(s.x, r * s.rs + j * s.cs))));
        }
    }
    part[warp][lane] = f2u(a);
    __syncthreads();
    if (warp == 0 && r < s.rows) {
        u32 b = part[0][lane];
#pragma unroll
        for (int w = 1; w < ROW_AMAX_WARPS; ++w) b = max(b, part[w][lane]);
        amax[r] = u2f(b);
    }
    __syncthreads();  // part is written again by the CTA's next unit
}

#define NVFP4_BLOCKS_OF(c) (c).src.rows * ((c).src.cols / BLOCK)
#define NVFP4_4OVER6_UNITS_OF(c) (c).src.rows / (k2d ? BLOCK : 1) * ((c).src.cols / BLOCK)

// Per input dtype, over both copies of X (VariantCopy; one launch per kernel for both):
// - nvfp4_row_amax: the amax of each row of each copy into its amax[rows] (row-scaled A_g, §5.10), a CTA per
//   unit of rows (row_amax_of_rows / row_amax_of_columns);
// - nvfp4_quantize_rows: the plain 1x16 chain (§5.1-§5.4, encode_block) with each row's own A_g
//   amax[r] (row-scaled NVFP4, §5.10);
// - nvfp4_4over6: 4over6 (§5.10) with A_g amax[per_row ? r : 0]; one unit per 1x16 block, or per
//   16x16 tile in IS_2D builds (per_row is 0 there: row-scaled is 1-D only).
#define NVFP4_VARIANT_INSTANTIATE(SUFFIX, DT)                                                                     \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_row_amax_##SUFFIX(NVFP4_VARIANT_PARAMS) {    \
        NVFP4_VARIANT_COPIES;                                                                                     \
        const i64 n_row = r_data ? ceil_div(m, ROW_AMAX_WARPS) : 0, n_col = c_data ? ceil_div(k, WARP) : 0;      \
        for (i64 u = blockIdx.x; u < n_row + n_col; u += gridDim.x) {                                            \
            if (u < n_row)                                                                                        \
                row_amax_of_rows<DT>(row_copy.src, row_copy.amax, u);                                             \
            else                                                                                                  \
                row_amax_of_columns<DT>(col_copy.src, col_copy.amax, u - n_row);                                  \
        }                                                                                                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_quantize_rows_##SUFFIX(NVFP4_VARIANT_PARAMS) { \
        NVFP4_VARIANT_COPIES;                                                                                     \
        zero_variant_paddings(row_copy, col_copy);                                                                \
        NVFP4_VARIANT_UNITS(i, NVFP4_BLOCKS_OF) {                                                                 \
            NVFP4_VARIANT_UNIT(i, c, u);                                                                          \
            const i64 nbc = c.src.cols / BLOCK, r = u / nbc, cb = u % nbc;                                        \
            const QuantArgs a = {c.src.cols, c.amax + r, 0ull, 0u, c.data, c.scale, c.scale_stride};             \
            float v[BLOCK];                                                                                       \
            copy_block<DT>(c.src, r, cb, v);                                                                      \
            const AmaxNan an = block_amax_nan(v);                                                                 \
            encode_block<false>(a, global_scale(c.amax[r]), r, cb, an.amax, an.has_nan, v);                       \
        }                                                                                                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)                                                   \
        nvfp4_4over6_##SUFFIX(NVFP4_VARIANT_PARAMS, int per_row) {                                                \
        NVFP4_VARIANT_COPIES;                                                                                     \
        zero_variant_paddings(row_copy, col_copy);                                                                \
        NVFP4_VARIANT_UNITS(i, NVFP4_4OVER6_UNITS_OF) {                                                           \
            NVFP4_VARIANT_UNIT(i, c, u);                                                                          \
            const i64 nbc = c.src.cols / BLOCK, ur = u / nbc, cb = u % nbc;                                       \
            if (k2d) {                                                                                            \
                four6_tile<DT>(c.src, c.amax[0], ur, cb, c.data, c.scale, c.scale_stride);                        \
            } else {                                                                                              \
                four6_block<DT>(c.src, c.amax[per_row ? ur : 0], ur, cb, c.data, c.scale, c.scale_stride);        \
            }                                                                                                     \
        }                                                                                                         \
    }

NVFP4_VARIANT_INSTANTIATE(f32, IN_F32)
NVFP4_VARIANT_INSTANTIATE(bf16, IN_BF16)
NVFP4_VARIANT_INSTANTIATE(f16, IN_F16)

// Dequantize a row-scaled copy: as nvfp4_dequantize with row r's own A_g amax_rows[r] (§5.8, §5.10).
extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)
    nvfp4_dequantize_rows(const u8* data, const u8* scale, i64 scale_stride, const float* amax_rows, i64 rows,
                          i64 cols, float* out) {
    NVFP4_GRID_STRIDE(u, rows * (cols / BLOCK))
    dequantize_unit(data, scale, scale_stride, amax_rows + u / (cols / BLOCK), cols, out, u);
}
