// fwd_probe.cu — standalone check and timing harness for the la_fwd kernel family, used on the
// GPU machine before the runtime can launch it. It loads one expanded-and-compiled cubin through
// the Driver API (as the runtime will), fills la_params, and either
//   check: compares outputs and final states with a CPU float64 reference of the recurrence
//          (DESIGN.md) on fresh random inputs, outputs poisoned with NaN, for a list of N; or
//   time:  times the kernel with events (warm-up, median of repeats) for a list of N and prints
//          ms and the fraction of the bandwidth floor.
// Usage: fwd_probe MODE CUBIN dtype D E BLOCK TILE_V WARPS STAGES decay init final varlen vk
//                  bnhd B H N1,N2,...
#include <cuda.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include <algorithm>
#include <random>

#include "../../templates/common/la_params.h"
#include "probe_elem.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *s_ = 0;                                                                    \
            cuGetErrorName(r_, &s_);                                                               \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");          \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static int g_dt; // 0 f32, 1 f16, 2 bf16
static size_t esz() { return g_dt == 0 ? 4 : 2; }

// Rounds to the storage dtype g_dt and returns the rounded value; writes the bits to dst.
static float store_el(void *dst, size_t i, float x) { return store_elem(g_dt, dst, i, x); }
static double load_el(const void *src, size_t i) { return load_elem(g_dt, src, i); }

struct Cfg {
    int D, E, BLOCK, TILE_V, WARPS, STAGES, decay, init, fin, varlen, vk, bnhd, B, H;
};

static size_t smem_bytes(const Cfg &c)
{
    size_t s = esz(), ve = 16 / s;
    size_t ldq = c.D + ve, ldv = c.TILE_V + ve;
    size_t b = c.STAGES * (2 * c.BLOCK * ldq + c.BLOCK * ldv) * s + c.D * ldv * s;
    return b + (c.BLOCK + 1) * 4;
}

static CUfunction g_fn;

static void launch(const Cfg &c, const la_params &p, int nb, CUstream st)
{
    void *args[] = {(void *)&p};
    CK(cuLaunchKernel(g_fn, c.E / c.TILE_V, c.H, nb, c.WARPS * 32, 1, 1, (unsigned)smem_bytes(c),
                      st, args, 0));
}

// Logical [b, h, t, x] strides for a sequence tensor of width W: [B,H,N,W] or [B,N,H,W]; varlen
// packed [T,H,W] (batch stride unused).
static la_tensor4 tens(CUdeviceptr p, const Cfg &c, int N, int W)
{
    la_tensor4 t;
    t.ptr = p;
    t.s3 = 1;
    if (c.varlen || c.bnhd) {
        t.s1 = W;
        t.s2 = (long long)c.H * W;
        t.s0 = c.varlen ? 0 : (long long)N * c.H * W;
    } else {
        t.s2 = W;
        t.s1 = (long long)N * W;
        t.s0 = (long long)c.H * N * W;
    }
    return t;
}

static std::mt19937_64 rng(12345);
static float urand() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

// Element offset of token (b, h, t, x) in a host copy laid out like tens().
static size_t off(const la_tensor4 &t, int b, int h, long long tok, int x)
{
    return (size_t)(b * t.s0 + h * t.s1 + tok * t.s2 + x);
}

static int check(const Cfg &c, int N)
{
    const double tol = g_dt == 2 ? 6e-3 : 1e-3;
    int nseq = c.B;
    std::vector<int> cu(1, 0), lens;
    if (c.varlen) { // lengths: N, 0, 65, 1, ... (an empty sequence included)
        int pat[4] = {N, 0, 65, 1};
        for (int i = 0; i < nseq; i++) lens.push_back(pat[i % 4]);
    } else {
        for (int i = 0; i < nseq; i++) lens.push_back(N);
    }
    for (int l : lens) cu.push_back(cu.back() + l);
    const int T = cu.back();
    const int Ntens = c.varlen ? T : N; // token extent of the tensors
    const int Bt = c.varlen ? 1 : c.B;
    const size_t nq = (size_t)Bt * c.H * Ntens * c.D, nv = (size_t)Bt * c.H * Ntens * c.E;
    std::vector<char> hq(nq * esz() + 16), hk(nq * esz() + 16), hv(nv * esz() + 16), ho(nv * esz() + 16);
    std::vector<double> fq(nq), fk(nq), fv(nv);
    for (size_t i = 0; i < nq; i++) fq[i] = store_el(hq.data(), i, urand());
    for (size_t i = 0; i < nq; i++) fk[i] = store_el(hk.data(), i, urand());
    for (size_t i = 0; i < nv; i++) fv[i] = store_el(hv.data(), i, urand());
    std::vector<float> sdec(c.H);
    for (int h = 0; h < c.H; h++) sdec[h] = h == 0 ? 0.f : 0.02f + 0.9f * (float)h / c.H;
    const float sigma = 1.0f / sqrtf((float)c.D);
    // States: pool of P slots; varlen uses slots {2, -1, 0, 4, ...} and writes in place.
    const int P = c.varlen ? 4 * ((nseq + 3) / 4) + 1 : c.B;
    std::vector<int> slots(nseq);
    for (int i = 0; i < nseq; i++) {
        static const int pat[4] = {2, -1, 0, 3}; // distinct slots, one skipped
        slots[i] = c.varlen ? (pat[i % 4] < 0 ? -1 : pat[i % 4] + 4 * (i / 4)) : i;
    }
    const size_t ns = (size_t)P * c.H * c.D * c.E;
    std::vector<float> s0(ns);
    for (auto &x : s0) x = urand();
    auto sidx = [&](int slot, int h, int d, int e) -> size_t {
        size_t base = ((size_t)slot * c.H + h) * c.D * c.E;
        return base + (c.vk ? (size_t)e * c.D + d : (size_t)d * c.E + e);
    };

    CUdeviceptr dq, dk, dv, dO, ds0, dsn, ddec, dcu, dslots;
    CK(cuMemAlloc(&dq, hq.size()));
    CK(cuMemAlloc(&dk, hk.size()));
    CK(cuMemAlloc(&dv, hv.size()));
    CK(cuMemAlloc(&dO, ho.size()));
    CK(cuMemAlloc(&ds0, ns * 4 + 16));
    CK(cuMemAlloc(&dsn, ns * 4 + 16));
    CK(cuMemAlloc(&ddec, c.H * 4));
    CK(cuMemAlloc(&dcu, cu.size() * 4));
    CK(cuMemAlloc(&dslots, nseq * 4 + 4));
    CK(cuMemcpyHtoD(dq, hq.data(), hq.size()));
    CK(cuMemcpyHtoD(dk, hk.data(), hk.size()));
    CK(cuMemcpyHtoD(dv, hv.data(), hv.size()));
    CK(cuMemsetD8(dO, 0xff, ho.size())); // NaN in every dtype
    CK(cuMemcpyHtoD(ds0, s0.data(), ns * 4));
    CK(cuMemsetD8(dsn, 0xff, ns * 4));
    CK(cuMemcpyHtoD(ddec, sdec.data(), c.H * 4));
    CK(cuMemcpyHtoD(dcu, cu.data(), cu.size() * 4));
    CK(cuMemcpyHtoD(dslots, slots.data(), nseq * 4));

    la_params p;
    memset(&p, 0, sizeof p);
    p.q = tens(dq, c, Ntens, c.D);
    p.k = tens(dk, c, Ntens, c.D);
    p.v = tens(dv, c, Ntens, c.E);
    p.o = tens(dO, c, Ntens, c.E);
    la_tensor4 st;
    st.s0 = (long long)c.H * c.D * c.E;
    st.s1 = (long long)c.D * c.E;
    st.s2 = c.vk ? 1 : c.E;
    st.s3 = c.vk ? c.D : 1;
    st.ptr = c.init ? ds0 : 0;
    p.s0 = st;
    // varlen: final state written in place into the pool (aliasing S_0); else a separate buffer.
    st.ptr = c.fin ? (c.varlen && c.init ? ds0 : dsn) : 0;
    p.sn = st;
    p.decay = c.decay ? ddec : 0;
    p.cu_seqlens = c.varlen ? dcu : 0;
    p.slots = c.varlen ? dslots : 0;
    p.B = c.B;
    p.H = c.H;
    p.N = c.varlen ? 0 : N;
    p.D = c.D;
    p.E = c.E;
    p.nseq = nseq;
    p.P = P;
    p.scale = sigma;
    launch(c, p, nseq, 0);
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(ho.data(), dO, ho.size()));
    std::vector<float> snh(ns);
    CK(cuMemcpyDtoH(snh.data(), (c.varlen && c.init && c.fin) ? ds0 : dsn, ns * 4));

    // Reference, float64, token by token.
    double num = 0, den = 0, snum = 0, sden = 0, worst_tok = 0;
    long long bad_tok = 0, nan_count = 0;
    std::vector<double> S((size_t)c.D * c.E);
    std::vector<double> errt, reft;
    int state_untouched_bad = 0;
    for (int sq = 0; sq < nseq; sq++) {
        const int slot = slots[sq];
        for (int h = 0; h < c.H; h++) {
            const double lam = c.decay ? exp(-(double)sdec[h]) : 1.0;
            for (int d = 0; d < c.D; d++)
                for (int e = 0; e < c.E; e++)
                    S[(size_t)d * c.E + e] = (c.init && slot >= 0) ? s0[sidx(slot, h, d, e)] : 0.0;
            const int b = c.varlen ? 0 : sq;
            const long long t0 = c.varlen ? cu[sq] : 0;
            errt.clear();
            reft.clear();
            for (int t = 0; t < lens[sq]; t++) {
                const long long tok = t0 + t;
                for (int d = 0; d < c.D; d++) {
                    const double kd = fk[off(p.k, b, h, tok, d)];
                    double *row = &S[(size_t)d * c.E];
                    for (int e = 0; e < c.E; e++) row[e] = lam * row[e] + kd * fv[off(p.v, b, h, tok, e)];
                }
                double en = 0, rn = 0;
                for (int e = 0; e < c.E; e++) {
                    double acc = 0;
                    for (int d = 0; d < c.D; d++) acc += fq[off(p.q, b, h, tok, d)] * S[(size_t)d * c.E + e];
                    acc *= sigma;
                    const double got = load_el(ho.data(), off(p.o, b, h, tok, e));
                    if (!std::isfinite(got)) nan_count++;
                    en += (got - acc) * (got - acc);
                    rn += acc * acc;
                }
                num += en;
                den += rn;
                errt.push_back(sqrt(en));
                reft.push_back(sqrt(rn));
            }
            double mean = 0;
            for (double r : reft) mean += r;
            mean = reft.empty() ? 0 : mean / reft.size();
            for (size_t i = 0; i < errt.size(); i++) {
                const double lim = 3 * tol * std::max(reft[i], mean);
                if (!(errt[i] <= lim)) bad_tok++;
                worst_tok = std::max(worst_tok, errt[i] / std::max(reft[i], mean));
            }
            if (c.fin && slot >= 0) {
                for (int d = 0; d < c.D; d++)
                    for (int e = 0; e < c.E; e++) {
                        const double r = S[(size_t)d * c.E + e], g = snh[sidx(slot, h, d, e)];
                        if (!std::isfinite(g)) nan_count++;
                        snum += (g - r) * (g - r);
                        sden += r * r;
                    }
            }
        }
    }
    // Pool slots nobody wrote must be untouched (varlen in place) or still poisoned.
    if (c.varlen && c.fin && c.init) {
        std::vector<char> written(P, 0);
        for (int sq = 0; sq < nseq; sq++)
            if (slots[sq] >= 0) written[slots[sq]] = 1;
        for (int sl = 0; sl < P; sl++)
            if (!written[sl])
                for (size_t i = 0; i < (size_t)c.H * c.D * c.E; i++)
                    if (snh[(size_t)sl * c.H * c.D * c.E + i] != s0[(size_t)sl * c.H * c.D * c.E + i]) state_untouched_bad++;
    }
    const double rel = den > 0 ? sqrt(num / den) : 0, srel = sden > 0 ? sqrt(snum / sden) : 0;
    const bool ok = nan_count == 0 && rel <= tol && srel <= tol && bad_tok == 0 && state_untouched_bad == 0;
    printf("%s N=%-5d relL2 o=%.2e SN=%.2e worst_tok=%.2e bad_tok=%lld nan=%lld untouched_bad=%d\n",
           ok ? "PASS" : "FAIL", N, rel, srel, worst_tok, bad_tok, nan_count, state_untouched_bad);
    cuMemFree(dq);
    cuMemFree(dk);
    cuMemFree(dv);
    cuMemFree(dO);
    cuMemFree(ds0);
    cuMemFree(dsn);
    cuMemFree(ddec);
    cuMemFree(dcu);
    cuMemFree(dslots);
    return ok ? 0 : 1;
}

static void time_one(const Cfg &c, int N)
{
    const size_t nq = (size_t)c.B * c.H * N * c.D, nv = (size_t)c.B * c.H * N * c.E;
    CUdeviceptr dq, dk, dv, dO, ddec;
    CK(cuMemAlloc(&dq, nq * esz()));
    CK(cuMemAlloc(&dk, nq * esz()));
    CK(cuMemAlloc(&dv, nv * esz()));
    CK(cuMemAlloc(&dO, nv * esz()));
    CK(cuMemAlloc(&ddec, c.H * 4));
    // Random (never zero) inputs: one 32 MiB block of random values copied over each tensor.
    {
        static std::vector<char> blk;
        const size_t nb = 32u << 20;
        if (blk.empty()) {
            blk.resize(nb);
            for (size_t i = 0; i < nb / esz(); i++) store_el(blk.data(), i, urand());
        }
        CUdeviceptr bufs[4] = {dq, dk, dv, dO};
        size_t sizes[4] = {nq * esz(), nq * esz(), nv * esz(), nv * esz()};
        for (int b = 0; b < 4; b++)
            for (size_t o = 0; o < sizes[b]; o += nb)
                CK(cuMemcpyHtoD(bufs[b] + o, blk.data(), std::min(nb, sizes[b] - o)));
    }
    std::vector<float> sdec(c.H);
    for (int h = 0; h < c.H; h++) sdec[h] = powf(2.f, -8.f * (h + 1) / c.H);
    CK(cuMemcpyHtoD(ddec, sdec.data(), c.H * 4));
    la_params p;
    memset(&p, 0, sizeof p);
    p.q = tens(dq, c, N, c.D);
    p.k = tens(dk, c, N, c.D);
    p.v = tens(dv, c, N, c.E);
    p.o = tens(dO, c, N, c.E);
    p.decay = c.decay ? ddec : 0;
    p.B = c.B;
    p.H = c.H;
    p.N = N;
    p.D = c.D;
    p.E = c.E;
    p.nseq = c.B;
    p.scale = 1.f;
    for (int i = 0; i < 3; i++) launch(c, p, c.B, 0);
    CK(cuCtxSynchronize());
    const int reps = N <= 4096 ? 50 : 20;
    std::vector<float> ms;
    CUevent e0, e1;
    CK(cuEventCreate(&e0, 0));
    CK(cuEventCreate(&e1, 0));
    for (int r = 0; r < reps; r++) {
        CK(cuEventRecord(e0, 0));
        launch(c, p, c.B, 0);
        CK(cuEventRecord(e1, 0));
        CK(cuEventSynchronize(e1));
        float t;
        CK(cuEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double bytes = (double)c.B * c.H * N * (2.0 * c.D + 2.0 * c.E) * esz();
    const double floor_ms = bytes / 4.22e12 * 1e3;
    const double flops = (double)c.B * c.H * N * (2.0 * 64 * (c.D + c.E) + 4.0 * c.D * c.E);
    printf("TIME D=%d E=%d N=%-6d BLOCK=%d TILE_V=%d WARPS=%d STAGES=%d  ms=%.4f  floor=%.4f  %%floor=%.1f  min=%.4f max=%.4f  TFLOPs(eff)=%.0f\n",
           c.D, c.E, N, c.BLOCK, c.TILE_V, c.WARPS, c.STAGES, med, floor_ms, 100 * floor_ms / med,
           ms.front(), ms.back(), flops / med * 1e-9);
    cuEventDestroy(e0);
    cuEventDestroy(e1);
    cuMemFree(dq);
    cuMemFree(dk);
    cuMemFree(dv);
    cuMemFree(dO);
    cuMemFree(ddec);
}

int main(int argc, char **argv)
{
    if (argc < 19) {
        fprintf(stderr, "usage: fwd_probe check|time CUBIN dtype D E BLOCK TILE_V WARPS STAGES decay init final varlen vk bnhd B H N1,N2,...\n");
        return 2;
    }
    const std::string mode = argv[1];
    const std::string dt = argv[3];
    g_dt = dt == "f32" ? 0 : dt == "f16" ? 1 : 2;
    Cfg c;
    int *f[] = {&c.D, &c.E, &c.BLOCK, &c.TILE_V, &c.WARPS, &c.STAGES, &c.decay, &c.init, &c.fin,
                &c.varlen, &c.vk, &c.bnhd, &c.B, &c.H};
    for (int i = 0; i < 14; i++) *f[i] = atoi(argv[4 + i]);
    std::vector<int> Ns;
    for (char *s = strtok(argv[18], ","); s; s = strtok(0, ",")) Ns.push_back(atoi(s));

    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CK(cuModuleLoad(&mod, argv[2]));
    CK(cuModuleGetFunction(&g_fn, mod, "la_fwd"));
    CK(cuFuncSetAttribute(g_fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem_bytes(c)));
    int nreg = 0;
    cuFuncGetAttribute(&nreg, CU_FUNC_ATTRIBUTE_NUM_REGS, g_fn);
    int occ = 0;
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&occ, g_fn, c.WARPS * 32, smem_bytes(c)));
    printf("# %s %s D=%d E=%d BLOCK=%d TILE_V=%d WARPS=%d STAGES=%d decay=%d init=%d final=%d varlen=%d vk=%d bnhd=%d B=%d H=%d smem=%zu regs=%d ctas/sm=%d\n",
           mode.c_str(), dt.c_str(), c.D, c.E, c.BLOCK, c.TILE_V, c.WARPS, c.STAGES, c.decay, c.init,
           c.fin, c.varlen, c.vk, c.bnhd, c.B, c.H, smem_bytes(c), nreg, occ);
    int fails = 0;
    for (int N : Ns) {
        if (mode == "check")
            fails += check(c, N);
        else
            time_one(c, N);
    }
    return fails ? 1 : 0;
}
