// decode_probe.cu — standalone check and cold-L2 timing of the la_decode template variants.
//
// Build (bench/probe/build_decode_probe.sh): expand_decode.py substitutes the template constants
// for each variant into decode_variants.cuh, which this file includes. The probe fills la_params
// as the host will (runtime/ops.c), then
//   check: every variant against a float64 CPU reference on random inputs: NaN-poisoned outputs
//          and step states, a pool with padded slot strides, shuffled slots with −1 rows (their
//          outputs, states and step states must stay byte-identical), strided q/k/v, and a
//          second run on restored inputs that must give the same bits;
//   perf:  per B, the median time of one decode step over CUDA-graph replays of L back-to-back
//          launches, each on another state of a rotating set of >= 256 MiB (cold L2), next to the
//          in-place ceiling (x *= c over the same bytes) timed the same way.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/la_params.h"
#include "common/types.cuh"
#include "probe_elem.h"

struct Variant {
    const char *name;
    const void *fn;
    int dtype, D, E, T, vk, decay, step, tile_v, warps, smem, role, persist;
};
static int g_sms = 132;           // multiprocessors (persistent grids)
static int g_persist_ctas = 0;    // > 0: override the persistent grid (check mode walks many tiles)
#include "decode_variants.cuh"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);
static int esize(int dt) { return dt == 0 ? 4 : 2; }

static void launch(const Variant &v, const la_params &p, cudaStream_t s = 0)
{
    dim3 grid(v.E / v.tile_v, p.H, p.B), block(v.warps * 32);
    if (v.persist) grid = dim3(g_persist_ctas > 0 ? g_persist_ctas : g_sms * v.persist, 1, 1);
    void *args[] = {(void *)&p};
    CK(cudaLaunchKernel(v.fn, grid, block, args, v.smem, s));
}

static void set_tensor(la_tensor4 &t, void *ptr, long long s0, long long s1, long long s2, long long s3)
{
    t.ptr = (unsigned long long)ptr;
    t.s0 = s0, t.s1 = s1, t.s2 = s2, t.s3 = s3;
}

// ---------------------------------------------------------------------------------------------
// Correctness
static bool check_variant(const Variant &v, std::mt19937 &rng, int B, int H, int P, bool use_slots)
{
    const int D = v.D, E = v.E, T = v.T, dt = v.dtype, es = esize(dt);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    // q, k: [B, T, H, DP] with a padded last dim (strided view); v, o: [B, T, H, EP].
    const int DP = D + 8, EP = E + 8;
    const size_t nq = (size_t)B * T * H * DP, nv = (size_t)B * T * H * EP;
    std::vector<char> hq(nq * es), hk(nq * es), hv(nv * es), ho(nv * es);
    std::vector<float> fq(nq), fk(nq), fv(nv);
    for (size_t i = 0; i < nq; ++i) fq[i] = store_elem(dt, hq.data(), i, U(rng));
    for (size_t i = 0; i < nq; ++i) fk[i] = store_elem(dt, hk.data(), i, U(rng) / std::sqrt((float)D));
    for (size_t i = 0; i < nv; ++i) fv[i] = store_elem(dt, hv.data(), i, U(rng));
    memset(ho.data(), 0xff, ho.size()); // NaN in every dtype
    // Pool [P, H, D, E] (or VK) with a padded slot stride.
    const long long sslot = (long long)H * D * E + 64;
    const size_t npool = (size_t)P * sslot;
    std::vector<float> pool(npool);
    for (auto &x : pool) x = U(rng);
    std::vector<float> decay(H);
    for (auto &x : decay) x = 0.05f + 0.9f * (U(rng) + 1.f) / 2.f;
    std::vector<int> slots(B);
    {
        std::vector<int> perm(P);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int b = 0; b < B; ++b) slots[b] = perm[b];
        if (use_slots && B >= 3) slots[1] = -1, slots[B - 1] = -1;
    }
    const size_t nss = (size_t)B * T * H * D * E;
    std::vector<float> hss(v.step ? nss : 1);
    memset(hss.data(), 0xff, hss.size() * 4);
    const float scale = 0.7f;

    char *dq, *dk, *dv, *dout;
    float *dpool, *ddecay, *dss;
    int *dslots;
    CK(cudaMalloc(&dq, hq.size()));
    CK(cudaMalloc(&dk, hk.size()));
    CK(cudaMalloc(&dv, hv.size()));
    CK(cudaMalloc(&dout, ho.size()));
    CK(cudaMalloc(&dpool, npool * 4));
    CK(cudaMalloc(&ddecay, H * 4));
    CK(cudaMalloc(&dss, hss.size() * 4));
    CK(cudaMalloc(&dslots, B * 4));
    CK(cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk.data(), hk.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ddecay, decay.data(), H * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dslots, slots.data(), B * 4, cudaMemcpyHostToDevice));

    la_params p;
    memset(&p, 0, sizeof p);
    set_tensor(p.q, dq, (long long)T * H * DP, DP, (long long)H * DP, 1);
    set_tensor(p.k, dk, (long long)T * H * DP, DP, (long long)H * DP, 1);
    set_tensor(p.v, dv, (long long)T * H * EP, EP, (long long)H * EP, 1);
    set_tensor(p.o, dout, (long long)T * H * EP, EP, (long long)H * EP, 1);
    if (v.vk) set_tensor(p.s0, dpool, sslot, (long long)D * E, 1, D);
    else set_tensor(p.s0, dpool, sslot, (long long)D * E, E, 1);
    p.sn = p.s0;
    if (v.step) {
        if (v.vk) set_tensor(p.step_states, dss, (long long)H * D * E, (long long)D * E, 1, D);
        else set_tensor(p.step_states, dss, (long long)H * D * E, (long long)D * E, E, 1);
    }
    p.decay = v.decay ? (unsigned long long)ddecay : 0;
    p.slots = use_slots ? (unsigned long long)dslots : 0;
    p.B = B, p.H = H, p.D = D, p.E = E, p.T = T, p.N = T, p.nseq = B, p.P = P;
    p.scale = scale;

    std::vector<char> got_o[2];
    std::vector<float> got_pool[2], got_ss[2];
    for (int run = 0; run < 2; ++run) {
        CK(cudaMemcpy(dout, ho.data(), ho.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpool, pool.data(), npool * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dss, hss.data(), hss.size() * 4, cudaMemcpyHostToDevice));
        launch(v, p);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        got_o[run].resize(ho.size());
        got_pool[run].resize(npool);
        got_ss[run].resize(hss.size());
        CK(cudaMemcpy(got_o[run].data(), dout, ho.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_pool[run].data(), dpool, npool * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_ss[run].data(), dss, hss.size() * 4, cudaMemcpyDeviceToHost));
    }
    // Bytes, not floats: the poison is NaN, and NaN != NaN.
    const bool deterministic = !memcmp(got_o[0].data(), got_o[1].data(), ho.size())
        && !memcmp(got_pool[0].data(), got_pool[1].data(), npool * 4)
        && !memcmp(got_ss[0].data(), got_ss[1].data(), hss.size() * 4);

    // Reference and comparison.
    double eo = 0, ro = 0, es_ = 0, rs_ = 0, ess = 0, rss = 0;
    bool untouched = true, nan = false;
    std::vector<double> S((size_t)D * E);
    std::vector<char> touched(P, 0);
    auto sidx = [&](int d, int e) { return v.vk ? (size_t)e * D + d : (size_t)d * E + e; };
    for (int b = 0; b < B; ++b) {
        const int slot = use_slots ? slots[b] : b;
        for (int h = 0; h < H; ++h) {
            if (slot < 0) {
                for (int t = 0; t < T; ++t)
                    for (int e = 0; e < E; ++e) {
                        const size_t oi = (((size_t)b * T + t) * H + h) * EP + e;
                        for (int by = 0; by < es; ++by)
                            if ((unsigned char)got_o[0][oi * es + by] != 0xff) untouched = false;
                    }
                if (v.step)
                    for (int t = 0; t < T; ++t)
                        for (size_t i = 0; i < (size_t)D * E; ++i) {
                            uint32_t u;
                            memcpy(&u, &got_ss[0][(((size_t)b * T + t) * H + h) * D * E + i], 4);
                            if (u != 0xffffffffu) untouched = false;
                        }
                continue;
            }
            touched[slot] = 1;
            const float *S0 = pool.data() + slot * sslot + (size_t)h * D * E;
            for (size_t i = 0; i < (size_t)D * E; ++i) S[i] = S0[i];
            const double lam = v.decay ? std::exp(-(double)decay[h]) : 1.0;
            for (int t = 0; t < T; ++t) {
                const float *q = fq.data() + (((size_t)b * T + t) * H + h) * DP;
                const float *k = fk.data() + (((size_t)b * T + t) * H + h) * DP;
                const float *vv = fv.data() + (((size_t)b * T + t) * H + h) * EP;
                for (int d = 0; d < D; ++d)
                    for (int e = 0; e < E; ++e) S[sidx(d, e)] = lam * S[sidx(d, e)] + (double)k[d] * vv[e];
                for (int e = 0; e < E; ++e) {
                    double acc = 0;
                    for (int d = 0; d < D; ++d) acc += (double)q[d] * S[sidx(d, e)];
                    acc *= scale;
                    const double g = load_elem(dt, got_o[0].data(), (((size_t)b * T + t) * H + h) * EP + e);
                    if (std::isnan(g) || std::isinf(g)) nan = true;
                    eo += (g - acc) * (g - acc), ro += acc * acc;
                }
                if (v.step) {
                    const float *ss = got_ss[0].data() + (((size_t)b * T + t) * H + h) * D * E;
                    for (size_t i = 0; i < (size_t)D * E; ++i) {
                        if (std::isnan(ss[i])) nan = true;
                        ess += (ss[i] - S[i]) * (ss[i] - S[i]), rss += S[i] * S[i];
                    }
                }
            }
            const float *SN = got_pool[0].data() + slot * sslot + (size_t)h * D * E;
            for (size_t i = 0; i < (size_t)D * E; ++i) {
                if (std::isnan(SN[i])) nan = true;
                es_ += (SN[i] - S[i]) * (SN[i] - S[i]), rs_ += S[i] * S[i];
            }
        }
    }
    // Untouched pool slots and the padding between slots stay byte-identical.
    for (int s = 0; s < P; ++s) {
        const size_t lo = touched[s] ? (size_t)s * sslot + (size_t)H * D * E : (size_t)s * sslot;
        const size_t hi = (size_t)(s + 1) * sslot;
        if (memcmp(&got_pool[0][lo], &pool[lo], (hi - lo) * 4) != 0) untouched = false;
    }
    const double tol = dt == 2 ? 6e-3 : 1e-3;
    const double erro = std::sqrt(eo / ro), errs = std::sqrt(es_ / rs_), errss = v.step ? std::sqrt(ess / rss) : 0;
    const bool ok = !nan && untouched && deterministic && erro <= tol && errs <= 1e-5 && errss <= 1e-5;
    printf("%-4s %-44s B=%d P=%d slots=%d  o %.2e  S_N %.2e  steps %.2e  untouched=%d det=%d nan=%d\n",
           ok ? "PASS" : "FAIL", v.name, B, P, (int)use_slots, erro, errs, errss, (int)untouched,
           (int)deterministic, (int)nan);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dpool), cudaFree(ddecay);
    cudaFree(dss), cudaFree(dslots);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Timing
template <int U>
__global__ void __launch_bounds__(256) inplace_scale(float4 *x, float c, long long n4)
{
    const long long base = (long long)blockIdx.x * 256 * U + threadIdx.x;
    float4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
        if (base + u * 256 < n4) r[u] = x[base + u * 256];
#pragma unroll
    for (int u = 0; u < U; ++u)
        if (base + u * 256 < n4) {
            r[u].x *= c, r[u].y *= c, r[u].z *= c, r[u].w *= c;
            x[base + u * 256] = r[u];
        }
}

// The ceiling with the decode kernel's argument (la_params, ~500 bytes) instead of 24 bytes: how
// much of a small-batch gap is the launch carrying a bigger argument.
__global__ void __launch_bounds__(256) inplace_scale_lp(const __grid_constant__ la_params p)
{
    float4 *x = reinterpret_cast<float4 *>(p.s0.ptr);
    const long long n4 = p.s0.s0, i = (long long)blockIdx.x * 256 + threadIdx.x;
    const float c = p.scale;
    if (i < n4) {
        float4 r = x[i];
        r.x *= c, r.y *= c, r.z *= c, r.w *= c;
        x[i] = r;
    }
}

__global__ void fill_random(float *x, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        x[i] = ((h & 0xffffff) / 16777216.f) * 2.f - 1.f; // never all zeros
    }
}

// Median µs per launch: a graph of L launches (launch_i(stream, i)) replayed `reps` times.
template <typename F>
static double time_graph(F launch_i, int L, int reps)
{
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < L; ++i) launch_i(s, i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int w = 0; w < 2; ++w) CK(cudaGraphLaunch(ge, s));
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(s);
    return ms[reps / 2] * 1000.0 / L;
}

int main(int argc, char **argv)
{
    const bool do_check = argc < 2 || !strcmp(argv[1], "check") || !strcmp(argv[1], "all");
    const bool do_perf = argc < 2 || !strcmp(argv[1], "perf") || !strcmp(argv[1], "all");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (cc %d.%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.l2CacheSize >> 20);
    g_sms = prop.multiProcessorCount;
    for (int i = 0; i < NV; ++i)
        if (VARIANTS[i].smem > 48 * 1024)
            CK(cudaFuncSetAttribute(VARIANTS[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));

    int fails = 0;
    if (do_check) {
        std::mt19937 rng(1234);
        for (int i = 0; i < NV; ++i) {
            const Variant &v = VARIANTS[i];
            const int H = v.D >= 256 ? 3 : 5;
            g_persist_ctas = 3; // persistent variants: each CTA walks several tiles, skipped rows included
            fails += !check_variant(v, rng, 6, H, 9, true);
            fails += !check_variant(v, rng, 2, H, 2, false);
            if (v.persist) { // and the grid the timing uses
                g_persist_ctas = 0;
                fails += !check_variant(v, rng, 6, H, 9, true);
            }
            g_persist_ctas = 0;
        }
        printf("check: %d failure(s)\n", fails);
    }
    if (!do_perf) return fails ? 1 : 0;

    // Perf: H=64, D=E=128, bf16, rotating sets of >= 256 MiB of states.
    const int H = 64, D = 128, E = 128;
    const int Bs[] = {1, 4, 16, 32, 64, 128, 256};
    const size_t state_bytes = (size_t)H * D * E * 4;
    const size_t pool_bytes = 2ull << 30; // 2 GiB: two sets at B = 256
    float *pool;
    CK(cudaMalloc(&pool, pool_bytes));
    fill_random<<<4096, 256>>>(pool, pool_bytes / 4, 77);
    const int TMAX = 4;
    char *dq, *dk, *dv, *dout;
    float *ddecay, *dss;
    const size_t nqk = (size_t)256 * TMAX * H * D, nvo = (size_t)256 * TMAX * H * E;
    CK(cudaMalloc(&dq, nqk * 2));
    CK(cudaMalloc(&dk, nqk * 2));
    CK(cudaMalloc(&dv, nvo * 2));
    CK(cudaMalloc(&dout, nvo * 2));
    CK(cudaMalloc(&ddecay, H * 4));
    int *dslots;
    CK(cudaMalloc(&dslots, 256 * 4));
    {
        std::vector<int> id(256);
        std::iota(id.begin(), id.end(), 0);
        CK(cudaMemcpy(dslots, id.data(), 256 * 4, cudaMemcpyHostToDevice));
    }
    // step states for T=4 at B <= 64 only (B*T*H*D*E*4 = 1 GiB at B = 64)
    const size_t ss_bytes = (size_t)64 * TMAX * state_bytes;
    CK(cudaMalloc(&dss, ss_bytes));
    {
        std::vector<uint16_t> h(nqk);
        std::mt19937 rng(5);
        std::uniform_real_distribution<float> U(-1.f, 1.f);
        for (auto &x : h) x = f2bf(U(rng) * 0.1f);
        CK(cudaMemcpy(dq, h.data(), nqk * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dk, h.data(), nqk * 2, cudaMemcpyHostToDevice));
        std::vector<uint16_t> hv(nvo);
        for (auto &x : hv) x = f2bf(U(rng) * 0.1f);
        CK(cudaMemcpy(dv, hv.data(), nvo * 2, cudaMemcpyHostToDevice));
        std::vector<float> dec(H);
        for (int i = 0; i < H; ++i) dec[i] = std::exp2(-8.0 * (i + 1) / H);
        CK(cudaMemcpy(ddecay, dec.data(), H * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaDeviceSynchronize());

    for (int pass = 0; pass < 2; ++pass) {
        printf("\n== pass %d: µs per step (graph of L back-to-back launches, median of 15 replays), "
               "cold L2 ==\n", pass);
        std::vector<double> ceil_us(7);
        printf("%-44s", "ceiling x*=c  U=1/2/4/8 -> best");
        for (int bi = 0; bi < 7; ++bi) printf(" B=%-7d", Bs[bi]);
        printf("\n");
        double cu[5][7];
        for (int ui = 0; ui < 5; ++ui) {
            for (int bi = 0; bi < 7; ++bi) {
                const int B = Bs[bi];
                const size_t set = (size_t)B * state_bytes;
                const int NS = std::max<size_t>(2, ((256ull << 20) + set - 1) / set);
                const int L = NS * std::max(1, 32 / NS);
                const long long n4 = set / 16;
                auto f = [&](cudaStream_t s, int i) {
                    float4 *x = (float4 *)((char *)pool + (i % NS) * set);
                    const float c = 1.0001f;
                    switch (ui) {
                    case 0: inplace_scale<1><<<(n4 + 255) / 256, 256, 0, s>>>(x, c, n4); break;
                    case 1: inplace_scale<2><<<(n4 + 511) / 512, 256, 0, s>>>(x, c, n4); break;
                    case 2: inplace_scale<4><<<(n4 + 1023) / 1024, 256, 0, s>>>(x, c, n4); break;
                    case 4: {
                        la_params lp;
                        memset(&lp, 0, sizeof lp);
                        lp.s0.ptr = (unsigned long long)x, lp.s0.s0 = n4, lp.scale = c;
                        inplace_scale_lp<<<(n4 + 255) / 256, 256, 0, s>>>(lp);
                        break;
                    }
                    default: inplace_scale<8><<<(n4 + 2047) / 2048, 256, 0, s>>>(x, c, n4); break;
                    }
                };
                cu[ui][bi] = time_graph(f, L, 15);
            }
        }
        for (int ui = 0; ui < 5; ++ui) {
            if (ui == 4) printf("  %-42s", "ceiling U=1, la_params argument");
            else printf("  ceiling U=%-33d", 1 << ui);
            for (int bi = 0; bi < 7; ++bi) printf(" %8.2f", cu[ui][bi]);
            printf("\n");
        }
        printf("%-44s", "  ceiling (best U)");
        for (int bi = 0; bi < 7; ++bi) {
            ceil_us[bi] = std::min(std::min(cu[0][bi], cu[1][bi]), std::min(cu[2][bi], cu[3][bi]));
            printf(" %8.2f", ceil_us[bi]);
        }
        printf("\n%-44s", "  ceiling TB/s");
        for (int bi = 0; bi < 7; ++bi) printf(" %8.3f", (double)Bs[bi] * state_bytes * 2 / ceil_us[bi] / 1e6);
        printf("\n");

        std::vector<double> best(7, 1e30), best4(7, 1e30), bestvk(7, 1e30);
        std::vector<int> besti(7, -1), best4i(7, -1), bestvki(7, -1);
        for (int vi = 0; vi < NV; ++vi) {
            const Variant &v = VARIANTS[vi];
            if (v.role == 0) continue;
            printf("%-44s", v.name);
            for (int bi = 0; bi < 7; ++bi) {
                const int B = Bs[bi];
                if (v.step && B > 64) { printf(" %12s", "-"); continue; }
                const size_t set = (size_t)B * state_bytes;
                const int NS = std::max<size_t>(2, ((256ull << 20) + set - 1) / set);
                const int L = NS * std::max(1, 32 / NS);
                la_params p;
                memset(&p, 0, sizeof p);
                const int T = v.T;
                set_tensor(p.q, dq, (long long)T * H * D, D, (long long)H * D, 1);
                set_tensor(p.k, dk, (long long)T * H * D, D, (long long)H * D, 1);
                set_tensor(p.v, dv, (long long)T * H * E, E, (long long)H * E, 1);
                set_tensor(p.o, dout, (long long)T * H * E, E, (long long)H * E, 1);
                if (v.step) {
                    if (v.vk) set_tensor(p.step_states, dss, (long long)H * D * E, (long long)D * E, 1, D);
                    else set_tensor(p.step_states, dss, (long long)H * D * E, (long long)D * E, E, 1);
                }
                p.decay = v.decay ? (unsigned long long)ddecay : 0;
                p.slots = v.role == 5 ? (unsigned long long)dslots : 0;
                p.B = B, p.H = H, p.D = D, p.E = E, p.T = T, p.N = T, p.nseq = B, p.P = B * NS;
                p.scale = 1.f;
                auto f = [&](cudaStream_t s, int i) {
                    la_params pi = p;
                    float *base = (float *)((char *)pool + (i % NS) * set);
                    if (v.vk) set_tensor(pi.s0, base, (long long)H * D * E, (long long)D * E, 1, D);
                    else set_tensor(pi.s0, base, (long long)H * D * E, (long long)D * E, E, 1);
                    pi.sn = pi.s0;
                    launch(v, pi, s);
                };
                const double us = time_graph(f, L, 15);
                const double pct = 100.0 * ceil_us[bi] / us;
                printf(" %7.2f/%3.0f%%", us, pct);
                if (v.role == 2 && us < bestvk[bi]) bestvk[bi] = us, bestvki[bi] = vi;
                if (v.role == 1 && us < best[bi]) best[bi] = us, besti[bi] = vi;
                if (v.role == 3 && us < best4[bi]) best4[bi] = us, best4i[bi] = vi;
            }
            printf("\n");
        }
        printf("\nsummary pass %d (H=64 D=E=128 bf16, decay, KV unless named)\n", pass);
        printf("%5s %9s %9s %9s %7s  %-34s %9s %7s  %-34s %9s %7s  %s\n", "B", "ceil_us", "ceil_TBs", "T1_us", "T1_%",
               "best T=1 KV variant", "T4_us", "T4_%", "best T=4 KV variant", "VK_us", "VK_%", "best T=1 VK");
        for (int bi = 0; bi < 7; ++bi) {
            const double bytes = (double)Bs[bi] * state_bytes * 2;
            printf("%5d %9.2f %9.3f %9.2f %6.1f%%  %-34s %9.2f %6.1f%%  %-34s %9.2f %6.1f%%  %s\n", Bs[bi], ceil_us[bi],
                   bytes / ceil_us[bi] / 1e6, best[bi], 100 * ceil_us[bi] / best[bi],
                   VARIANTS[besti[bi]].name, best4[bi], 100 * ceil_us[bi] / best4[bi],
                   VARIANTS[best4i[bi]].name, bestvk[bi], 100 * ceil_us[bi] / bestvk[bi], VARIANTS[bestvki[bi]].name);
        }
    }
    return fails ? 1 : 0;
}
