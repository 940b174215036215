-- family.lua — simple_gla_fwd: the chunked linear-attention forward with a data-dependent scalar
-- decay per token and head (log-gates g ≤ 0), as FLA's chunk_simple_gla with `g` computes it;
-- an outside family (examples/families, reached through LAJIT_FAMILY_PATH or
-- lajit_ctx_add_families and lajit_launch). fwd.cu says how the kernel works: lajit's
-- constant-decay Hopper forward (templates/la_fwd_sm90) with the gates' factors in place of λ^k.
--
-- One CTA of WGS warpgroups (128 threads each, TILE_V columns each, sharing the Q/K tiles) per
-- (E slice of WGS·TILE_V columns, head, sequence, and with SPLIT > 1 segment of the sequence):
-- grid {E / (WGS·TILE_V) · SPLIT, H, B}. sm_90a, f16/bf16, D = 64, 128, 192 or 256.

local spec = import("common/spec.lua")
local log2_bucket, with = spec.log2_bucket, spec.with

local ELEM = { f16 = "lj_f16", bf16 = "lj_bf16" }

-- SPLIT > 1 (fwd.cu): each sequence cut into up to SPLIT segments of at least SEG_MIN tokens
-- (two chunks), chained through the family's workspace. Per (b, h): SPLIT − 1 local states
-- (fp32 D x E) and their total gates (a float per column slice), and apart from them a flag per
-- segment and 16 columns; 16 bytes of counters before the flags. The arrival ticket is static
-- shared memory.
local SEG_MIN, SPLIT_STATIC = 128, 16
local function ws_per(cfg, problem)
    local nsl = problem.E // (cfg.WGS * cfg.TILE_V)
    return ((cfg.SPLIT - 1) * (problem.D * problem.E + nsl) * 4 + 15) // 16 * 16
end
local function flags_per(cfg, problem)
    return ((cfg.SPLIT - 1) * (problem.E // 16) * 4 + 15) // 16 * 16
end
local function static_smem(cfg)
    return cfg.SPLIT > 1 and SPLIT_STATIC or 0
end

-- The CTA's warpgroups: WGS for the products, and the helper's (fwd.cu's NT).
local function warpgroups(cfg)
    return cfg.WGS + (cfg.HELPER > 0 and 1 or 0)
end

-- Which helper a configuration takes where it takes one: V_w's (1) for one warpgroup of products,
-- the scores' and P's (2) for two (default() has the measurements).
local function helper_mods(cfg)
    return { HELPER = cfg.WGS == 2 and 2 or 1, SPLIT_QK = 0 }
end

-- Whether the scores are masked by column factors (fwd.cu's mask_scores: a thread's exponentials
-- no longer growing with its row, each warp's factors made as soon as the chunk's sums are known,
-- in 64 floats of shared memory per warp) or entry by entry. Measured on the H200 (bf16, defaults,
-- docs/notes/families.md, session 23): where the helper masks (HELPER 2) the factors take the
-- mask off its chain, 4 % at B = 4, H = 32, N = 8192, D = 128; where the products mask their own
-- scores, their Q S and state update (m64 x TILE_V products) run meanwhile, and at 64 columns
-- they hide the exponentials, so the factors' own making only adds (1.6 % slower at D = 64 and at
-- B = 2, H = 32, N = 16384), while at 16 and 32 columns the exponentials showed (6 % faster at
-- B = 2, H = 4, N = 512; 1.5 % at N = 1024). Not measured without a helper, so not taken there
-- (nor its 1–3 KiB: D = 256 with 32 columns and no helper fits 227 KiB by 256 bytes).
local function mask_by_factors(cfg)
    return cfg.HELPER == 2 or (cfg.HELPER == 1 and cfg.TILE_V <= 32)
end

-- Dynamic shared memory: the Q, K, V and gate ring, the weighted V copy (which also stages the
-- outputs; two with HELPER 1), each warpgroup's 16-bit state copy, with SPLIT_QK or HELPER 2 the
-- tile of P, each warp's 64 prefix sums (and 64 column factors), and 1 KiB to align the tiles
-- to the swizzle period.
-- fwd.cu static_asserts that its layout fits this.
local function smem(cfg, problem)
    local q = cfg.BLOCK * problem.D * 2
    local v = cfg.BLOCK * cfg.WGS * cfg.TILE_V * 2
    local g = cfg.BLOCK * 4
    local p = (cfg.SPLIT_QK == 1 or cfg.HELPER == 2) and cfg.BLOCK * cfg.BLOCK * 2 or 0
    local vw = cfg.HELPER == 1 and 2 or 1
    return cfg.STAGES * (2 * q + v + g) + vw * v + p + cfg.WGS * problem.D * cfg.TILE_V * 2
        + warpgroups(cfg) * 4 * (mask_by_factors(cfg) and 2 or 1) * cfg.BLOCK * 4 + 1024
end

-- Registers a thread holds across the chunk loop: the state (D·TILE_V/128) and the output
-- accumulators (TILE_V/2), plus the scores (32), addresses and the rest. la_fwd_sm90's model
-- (120 beside state and accumulators, with 32 of them its fixed score mask) less that mask:
-- here the mask is made per chunk from the prefix sums while P is packed. Checked with NVRTC
-- (CUDA 13.0, sm_90a) over every valid configuration of D = 64…256, E = 64…256, f16/bf16, with and
-- without states: no spills, at most 254 registers (D = 64, TILE_V = 128), 244 at D = 192 TILE_V =
-- 64, 236 at D = 128 TILE_V = 64 with states. SPLIT_QK holds half the scores (16) and no P
-- operand (P goes through shared memory), but ptxas does not always spend less: NVRTC as above,
-- bf16/f16, D = 64…256, SPLIT_QK takes from 70 fewer (D = 192 TILE_V = 16 with PREFETCH: 110
-- against 170) to 17 more (D = 192 TILE_V = 32, three stages, no PREFETCH: 200 against 183),
-- at most 236 (D = 128 TILE_V = 64 with states, as without it), no spills. The estimate (which
-- only rejects configurations) is kept as it is.
local function regs(cfg, problem)
    return problem.D * cfg.TILE_V // 128 + cfg.TILE_V // 2 + 100
        -- the segment's bounds and addresses held across the first walk; 4 more without PREFETCH,
        -- whose D = 192, TILE_V = 64 split configurations spill 8–16 bytes at 255 (NVRTC 13.0)
        + (cfg.SPLIT > 1 and (cfg.PREFETCH == 1 and 24 or 28) or 0)
end

local function valid(cfg, problem, device)
    if device.arch ~= "sm_90a" then return false, "wgmma needs sm_90a" end
    if ELEM[problem.dtype] == nil then return false, "f16 and bf16 only" end
    local D, E = problem.D, problem.E
    if D % 64 ~= 0 or D < 64 or D > 256 then
        return false, "D must be 64, 128, 192 or 256 (the m64 blocks of the state)"
    end
    if E % 16 ~= 0 or E < 16 or E > 256 then return false, "E must be a multiple of 16 from 16 to 256" end
    if cfg.BLOCK ~= 64 then return false, "BLOCK must be 64 (the wgmma M of one warpgroup)" end
    if cfg.SPLIT_QK == 1 and cfg.WGS ~= 2 then
        return false, "SPLIT_QK splits Q Kᵀ between two warpgroups (WGS = 2)"
    end
    if cfg.HELPER > 0 and cfg.PREFETCH ~= 1 then
        return false, "HELPER needs PREFETCH"
    end
    if cfg.HELPER == 2 and cfg.SPLIT_QK == 1 then
        return false, "HELPER 2 computes all of Q Kᵀ itself (no SPLIT_QK)"
    end
    if cfg.HELPER == 1 and cfg.WGS == 2 and cfg.SPLIT_QK == 0 and cfg.SPLIT > 1 then
        -- Both warpgroups' whole scores, the state and the split's bounds spill even with the
        -- helper's registers given to them (fwd.cu's REBALANCE; NVRTC 13.0, D = E = 128).
        return false, "HELPER 1 with two warpgroups and SPLIT needs SPLIT_QK (registers)"
    end
    if cfg.PREFETCH == 1 and cfg.STAGES < 3 then
        return false, "PREFETCH needs STAGES >= 3 (chunk c + 1 must have landed by mid-chunk c)"
    end
    if cfg.STAGES > 3 and cfg.PREFETCH == 0 then
        -- Measured, not assumed: the tuner at nine buckets (H200, session 23) found them at
        -- 1.15-1.54x its winner, never near the top; they only lengthened the tuning.
        return false, "STAGES 4 and 5 need PREFETCH"
    end
    local ok, why = spec.check_tile(cfg.WGS * cfg.TILE_V, E, "WGS*TILE_V")
    if not ok then return false, why end
    local r = regs(cfg, problem)
    if r > 255 then
        return false, string.format("about %d registers per thread needed (255 allowed)", r)
    end
    if cfg.SPLIT > 1 then
        -- Sequences long enough for SPLIT segments of SEG_MIN tokens; a whole-sequence grid that
        -- leaves half the SMs idle, and at most four CTAs per SM with the split (la_fwd_sm90's
        -- rule: beyond that a split only adds the second read and the local states).
        if problem.N < cfg.SPLIT * SEG_MIN then
            return false, string.format("SPLIT=%d: segments under %d tokens", cfg.SPLIT, SEG_MIN)
        end
        local ctas = problem.B * problem.H * (problem.E // (cfg.WGS * cfg.TILE_V))
        if 2 * ctas > device.sms then
            return false, string.format("SPLIT=%d: %d whole-sequence CTAs fill half the SMs",
                                        cfg.SPLIT, ctas)
        end
        if ctas * cfg.SPLIT > 4 * device.sms then
            return false, string.format("SPLIT=%d: %d CTAs, more than four per SM", cfg.SPLIT,
                                        ctas * cfg.SPLIT)
        end
    end
    return spec.check_smem(smem(cfg, problem) + static_smem(cfg), device)
end

-- How many CTAs of this configuration an SM holds at once (shared memory, and no more than the
-- grid gives each SM).
local function resident(cfg, problem, device, per_sm)
    return math.min(per_sm, device.smem_per_sm // (smem(cfg, problem) + 1024))
end

-- la_fwd_sm90's choice (its family.lua has the measurements): the widest slice (64 columns) whose
-- state and accumulators fit the registers while the grid covers half the SMs; two warpgroups
-- over the same Q/K tiles when E holds two slices and the grid still covers the SMs; a third
-- stage and PREFETCH when that costs no CTA its place on the SM; SPLIT_QK with two warpgroups
-- when PREFETCH hides its barrier (here: P is published by the barrier after V_w, none is added),
-- and at D = 256 where Q Kᵀ is the largest product. H200, bf16, D = E = 128, `lajit tune` over the
-- whole space (docs/notes/families.md): the default is the winner at B·H = 8 (1.501 ms) and 32
-- (0.407); at B·H = 128 it runs 0.3588 ms against the winner's 0.3545 (SPLIT_QK without PREFETCH).
-- Few heads, long sequences. When the whole-sequence grid of the widest slices leaves half the
-- SMs idle or more, every slice width (two warpgroups of 64 columns, one of 64, 32, 16) and
-- segment count is estimated, and the shortest estimate taken — where that grid fills a quarter
-- of the SMs or more, only with segments of SEG_LEN_FILLED tokens or more and if it also beats
-- the whole sequence's estimate (the shortest of the slice widths unsplit); nil when none does, or
-- none is worth splitting (fewer than four segments). The estimate: every CTA walks its segment
-- twice (the first walk without outputs; a whole sequence once) at walk_us() a chunk, the last
-- segment folds the S − 1 others' states at FOLD_US per 128 x 64 floats of its slice, and where
-- the grid holds more CTAs than SMs those that share an SM take SHARED of the time each would
-- take alone. Until session 23 only grids leaving three quarters of the SMs idle were split; at
-- B·H = 64, D = E = 64 (64 CTAs of the widest slices) the tuner's winner is four segments of 64
-- columns, 0.114 ms against 0.128 for whole sequences of 32 columns (B = 2, H = 32, N = 8192; the
-- estimates 105 and 115 µs; docs/notes/families.md, session 23, has the other shapes). H200, bf16
-- (docs/notes/families.md, sessions 20 and 21): walk_us() from session 20's fit (1.73 µs a chunk
-- with two warpgroups, 1.05 with one; 32- and 16-column slices ~0.9, where the tuner took them);
-- FOLD_US fitted to the tuner's choices of one against two warpgroups (B = 1, H = 8, N = 16384: two
-- and 16 segments 0.0844 ms, one and 8 0.0869; B = 2, H = 4, N = 8192: one and 8 the winner);
-- SHARED to two CTAs an SM against one with the helper (D = E = 64: B = 2, H = 16, N = 131072
-- 0.773 against 0.967 ms; B = 1, H = 4, N = 32768 0.0622 against 0.0511).
local SEG_LEN = 256 -- the shortest segments taken (the tuner found four chunks in 32-column
                    -- slices faster than two in 64-column ones, B = 2, H = 4, N = 1024)
local SEG_LEN_FILLED = 1024 -- ... where the whole-sequence grid fills a quarter of the SMs or more
                            -- (B = 2, H = 32, N = 1024, D = E = 64: four segments of 256 tokens
                            -- 0.0219 ms against 0.0190 whole, session 23)
local FOLD_US, SHARED = 0.5, 0.8
local function walk_us(c)
    if c.WGS == 2 then return 1.73 end
    return c.TILE_V >= 64 and 1.05 or 0.9
end
local function split_default(problem, device)
    local function ctas(c) return problem.B * problem.H * (problem.E // (c.WGS * c.TILE_V)) end
    local function estimate(c)
        -- the segment length as common/split.cuh's lj_split_segments cuts the sequence
        local len = c.SPLIT == 1 and (problem.N + c.BLOCK - 1) // c.BLOCK * c.BLOCK
            or math.max(SEG_MIN, ((problem.N + c.SPLIT - 1) // c.SPLIT + c.BLOCK - 1) // c.BLOCK * c.BLOCK)
        local fold = FOLD_US * problem.D * c.WGS * c.TILE_V / (128 * 64)
        local t = (c.SPLIT == 1 and 1 or 2) * (len // c.BLOCK) * walk_us(c) + (c.SPLIT - 1) * fold
        return t * math.max(1, SHARED * ctas(c) * c.SPLIT / device.sms)
    end
    -- Every slice width, and every segment count (a power of two from 4: two segments walk as
    -- many chunks one after the other as the whole sequence) with segments of SEG_LEN tokens or
    -- more, up to the count that gives every SM about as many CTAs as it holds; the helper where
    -- a CTA has its SM to itself anyway (one fits, or the grid gives each SM one).
    local pick, best, whole, widest = nil, math.huge, math.huge, true
    local beat_whole = false -- the widest slices fill a quarter of the SMs to half
    for _, slice in ipairs({ { 64, 2 }, { 64, 1 }, { 32, 1 }, { 16, 1 } }) do
        local tv, wgs = slice[1], slice[2]
        if problem.E % (wgs * tv) == 0 then
            local cfg = { BLOCK = 64, TILE_V = tv, WGS = wgs, SPLIT_QK = wgs == 2 and 1 or 0,
                          STAGES = 3, PREFETCH = 1, SPLIT = 1, HELPER = 0 }
            if widest then
                if 2 * ctas(cfg) > device.sms then return nil end
                beat_whole = 4 * ctas(cfg) > device.sms
            end
            widest = false
            whole = math.min(whole, estimate(cfg))
            local per_sm = resident(cfg, problem, device, 2)
            local split = 4
            -- (half as many segments still leave the SMs short of CTAs)
            while split <= 64 and problem.N >= split * (beat_whole and SEG_LEN_FILLED or SEG_LEN)
                and 10 * ctas(cfg) * (split // 2) < 9 * device.sms * per_sm do
                local at = with(cfg, { SPLIT = split })
                local alone = per_sm == 1 or ctas(at) * split <= device.sms
                for _, deep in ipairs({ alone and helper_mods(at) or {}, {}, { STAGES = 2, PREFETCH = 0 } }) do
                    local c = with(at, deep)
                    if valid(c, problem, device) then
                        local t = estimate(c)
                        if t < best then pick, best = c, t end
                        break
                    end
                end
                split = split * 2
            end
        end
    end
    if beat_whole and best >= whole then return nil end
    return pick
end

local function default(problem, device)
    local sc = split_default(problem, device)
    if sc then return sc end
    local bh = 1 << log2_bucket(problem.B * problem.H)
    local cfg = { BLOCK = 64, TILE_V = 64, WGS = 1, STAGES = 2, PREFETCH = 0, SPLIT_QK = 0, SPLIT = 1,
                  HELPER = 0 }
    while cfg.TILE_V > 16 and (cfg.TILE_V > problem.E or problem.E % cfg.TILE_V ~= 0) do
        cfg.TILE_V = cfg.TILE_V // 2
    end
    while cfg.TILE_V > 16 and problem.E % (cfg.TILE_V // 2) == 0
        and (2 * bh * (problem.E // cfg.TILE_V) < device.sms or regs(cfg, problem) > 255) do
        cfg.TILE_V = cfg.TILE_V // 2
    end
    if problem.E % (2 * cfg.TILE_V) == 0 and bh * (problem.E // cfg.TILE_V) >= device.sms then
        cfg.WGS = 2
    end
    local ctas = bh * (problem.E // (cfg.WGS * cfg.TILE_V))
    local per_sm = (ctas + device.sms - 1) // device.sms
    local deep = with(cfg, { STAGES = 3, PREFETCH = 1 })
    if smem(deep, problem) <= device.smem_optin
        and resident(deep, problem, device, per_sm) >= resident(cfg, problem, device, per_sm) then
        cfg = deep
    end
    if cfg.WGS == 2 and (cfg.PREFETCH == 1 or problem.D >= 256) then
        local split = with(cfg, { SPLIT_QK = 1 })
        if smem(split, problem) <= device.smem_optin then cfg = split end
    end
    -- The helper warpgroup where it is valid (PREFETCH), its tiles fit and the CTA has its SM to
    -- itself anyway (its 128 more threads would otherwise cost a resident CTA: not measured): it
    -- takes the loads and the gate scan off the chain every warp of the products waits on, and
    -- V_w (HELPER 1) where one warpgroup runs the products, or the scores and P (HELPER 2) where
    -- two share them (the helper's own chain is then the longer one with one warpgroup: B = 2,
    -- H = 32, N = 16384 0.357 ms with HELPER 1, 0.436 with 2; with two they tie without a split,
    -- 0.312 both at B = 4, H = 32, N = 8192, and 2 wins with it, split_default). H200, bf16,
    -- D = E = 128, `lajit tune` defaults (docs/notes/families.md, sessions 19 and 20): B = 4,
    -- H = 32, N = 8192 0.3446 -> 0.3137 ms; B = 2, H = 32, N = 16384 (one warpgroup) 0.4949 ->
    -- 0.3590; B = 4, H = 32, N = 2048 0.0951 -> 0.0865; B = 8, H = 16, N = 4096 0.1785 -> 0.1633.
    -- With the SM to itself and a walk of 64 chunks or more (a power of two: the key's N buckets)
    -- the CTA also takes the deepest ring that fits, up to five chunks in flight: B = 4, H = 32,
    -- D = E = 64, N = 8192 0.160 -> 0.150 ms with five (N = 4096 0.0846 -> 0.0792); B = 2, H = 32,
    -- N = 16384 0.357 -> 0.354 with four; but B = 2, H = 4, N = 512 0.0111 -> 0.0113 with five
    -- (H200, bf16, session 23).
    local deep_ring = problem.N >= 64 * cfg.BLOCK
    if cfg.PREFETCH == 1 and resident(cfg, problem, device, per_sm) == 1 then
        for _, mods in ipairs({ helper_mods(cfg), { HELPER = 1 } }) do
            local h = with(cfg, mods)
            if valid(h, problem, device) then
                for stages = deep_ring and 5 or 3, 4, -1 do
                    local deeper = with(h, { STAGES = stages })
                    if valid(deeper, problem, device) then return deeper end
                end
                return h
            end
        end
    end
    return cfg
end

return {
    name = "simple_gla_fwd",
    op = "custom",
    archs = { "sm_90a" },
    dtypes = { "f16", "bf16" },
    dynamic = { "B", "N" },              -- read from q's sizes at run time; H, D, E are baked

    -- q, k, v, o are copied in 16-byte pieces of rows (cp.async, vector stores): unit last
    -- stride, 16-byte aligned rows. g is read a float at a time (any strides: FLA's [B, N, H]
    -- layout is a view), the states element by element.
    args = {
        { name = "q", dtype = "dtype", shape = { "B", "H", "N", "D" }, unit_stride = true, align = 16 },
        { name = "k", dtype = "dtype", shape = { "B", "H", "N", "D" }, unit_stride = true, align = 16 },
        { name = "v", dtype = "dtype", shape = { "B", "H", "N", "E" }, unit_stride = true, align = 16 },
        { name = "g", dtype = "f32", shape = { "B", "H", "N" }, fill = { -0.1, 0 } },
        { name = "h0", dtype = "f32", shape = { "B", "H", "D", "E" }, optional = true },
        { name = "o", dtype = "dtype", shape = { "B", "H", "N", "E" }, output = true,
          unit_stride = true, align = 16 },
        { name = "ht", dtype = "f32", shape = { "B", "H", "D", "E" }, output = true, optional = true },
        { name = "scale", scalar = "f32" },
        { name = "ws", workspace = true }, -- SPLIT's chain (fwd.cu); none without a split
    },

    params = {
        BLOCK = { 64 },                  -- tokens per chunk: the M of one warpgroup's wgmma
        TILE_V = { 16, 32, 64, 128 },    -- E columns per warpgroup
        WGS = { 1, 2 },                  -- warpgroups per CTA, sharing the Q and K tiles
        STAGES = { 2, 3, 4, 5 },         -- chunks in flight in the cp.async ring
        PREFETCH = { 0, 1 },             -- Q Kᵀ of the next chunk issued during this chunk's tail
        SPLIT_QK = { 0, 1 },             -- two warpgroups compute half of Q Kᵀ (and its mask) each, P shared
        HELPER = { 0, 1, 2 },            -- a third warpgroup loads the chunks, scans the gates, makes V_w (1) or P (2)
        SPLIT = { 1, 2, 4, 8, 16, 32, 64 }, -- segments per sequence (fwd.cu)
    },

    problems = {
        { op = "custom", dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128,
          has_h0 = false, has_ht = false },
        { op = "custom", dtype = "bf16", B = 4, H = 32, N = 8192, D = 64, E = 64,
          has_h0 = false, has_ht = false },
        { op = "custom", dtype = "f16", B = 2, H = 8, N = 2048, D = 128, E = 64,
          has_h0 = true, has_ht = true },
        { op = "custom", dtype = "bf16", B = 1, H = 8, N = 65536, D = 128, E = 128,
          has_h0 = false, has_ht = true },
    },

    valid = valid,
    default = default,

    key = function(problem)
        return string.format("%s_D%d_E%d_H%d%s%s_n%d_bh%d", problem.dtype, problem.D, problem.E,
                             problem.H, problem.has_h0 and "_h0" or "", problem.has_ht and "_ht" or "",
                             log2_bucket(math.max(problem.N, 1)), log2_bucket(problem.B * problem.H))
    end,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // (cfg.WGS * cfg.TILE_V) * cfg.SPLIT, "H", "B" },
            block = { 128 * warpgroups(cfg), 1, 1 },
            smem = smem(cfg, problem),
            entry = "simple_gla_fwd",
            -- 16 bytes of counters, then per row of B and head the flags and the local states.
            workspace = cfg.SPLIT > 1 and { bytes = 16, times = { "B" },
                per = problem.H * (flags_per(cfg, problem) + ws_per(cfg, problem)) } or 0,
        }
    end,

    -- What a compile may use (the compile sweep checks it): 255 registers (one CTA of at most
    -- 256 threads per SM), and the dynamic shared memory launch() asks for (no static).
    resources = function(cfg, problem, device)
        return { regs = 255, smem = smem(cfg, problem) + static_smem(cfg) }
    end,

    source = function(cfg, problem, device)
        return {
            template = "simple_gla_fwd/fwd.cu",
            consts = {
                ELEM = ELEM[problem.dtype],
                H = problem.H,
                D = problem.D,
                E = problem.E,
                HAS_H0 = spec.b(problem.has_h0),
                HAS_HT = spec.b(problem.has_ht),
                SMEM = smem(cfg, problem),
                MASK_BY_FACTORS = spec.b(mask_by_factors(cfg)),
                SPLIT = cfg.SPLIT,
                SEG_MIN = SEG_MIN,
                WS_PER = ws_per(cfg, problem),
                FLAGS_PER = flags_per(cfg, problem),
            },
        }
    end,
}
