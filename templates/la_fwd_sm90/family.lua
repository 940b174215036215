-- family.lua — la_fwd_sm90: the chunked Lightning Attention forward on Hopper's wgmma (fwd.cu says
-- how the kernel works; docs/notes/la_fwd.md has the measurements behind the choices below).
--
-- One CTA of WGS warpgroups (128 threads each, TILE_V columns each, sharing the Q/K tiles) per
-- (E slice of WGS·TILE_V columns, head, sequence): grid {E / (WGS·TILE_V), H, B or nseq}. It
-- serves what it can — sm_90a, f16/bf16, D = 64, 128, 192 or 256 — and the op falls back to la_fwd
-- (mma.sync) for the rest (fp32 inputs: tf32 wgmma reads K-major operands only, and this kernel
-- reads K and V transposed).

local spec = import("common/spec.lua")
local log2_bucket, with = spec.log2_bucket, spec.with

local ELEM = { f16 = "lj_f16", bf16 = "lj_bf16" }

-- Dynamic shared memory: the Q, K, V ring, the weighted V copy (which also stages the outputs),
-- each warpgroup's 16-bit state copy, with SPLIT_QK the tiles of P (two with PREFETCH: the next
-- chunk's is written while the other warpgroup may still read this one's), λ^k for k = 0..BLOCK,
-- and 1 KiB to align the tiles to the swizzle period. The backward's dq pass with ds
-- (problem.ds, set by la_bwd_sm90) adds the x ring, Y's weighted values and Y's copies; its
-- reduction slots are static shared memory (DS_STATIC bytes at most: a float per warp, a flag).
local DS_STATIC = 64

-- SPLIT > 1 (common/split.cuh): each sequence cut into up to SPLIT segments of at least SEG_MIN
-- tokens, walked by their own CTAs; the arrival ticket is static shared memory (SPLIT_STATIC).
-- The chain's buffers per (sequence, head): SPLIT − 1 incoming states (fp32 D x E), and apart
-- from them a flag per 16 columns of each (the kernel's layout; plan_build.c allocates
-- sequences·H·split_ws bytes of states and 16 + sequences·H·split_flags of flags).
local SEG_MIN, SPLIT_STATIC = 1024, 16
local function split_ws(cfg, problem)
    return (cfg.SPLIT - 1) * problem.D * problem.E * 4
end
local function split_flags(cfg, problem)
    return ((cfg.SPLIT - 1) * (problem.E // 16) * 4 + 15) // 16 * 16
end
local function static_smem(cfg, problem)
    return (problem.ds and DS_STATIC or 0) + (cfg.SPLIT > 1 and SPLIT_STATIC or 0)
end
local function smem(cfg, problem)
    local q = cfg.BLOCK * problem.D * 2
    local v = cfg.BLOCK * cfg.WGS * cfg.TILE_V * 2
    local p = cfg.SPLIT_QK * (cfg.PREFETCH == 1 and 2 or 1) * cfg.BLOCK * cfg.BLOCK * 2
    local ds = problem.ds and (cfg.STAGES * v + v + cfg.WGS * problem.D * cfg.TILE_V * 2 + p) or 0
    return cfg.STAGES * (2 * q + v) + v + p
        + cfg.WGS * problem.D * cfg.TILE_V * 2 + (cfg.BLOCK + 1) * 4 + 1024 + ds
end

-- Registers a thread holds across the chunk loop: the state (D·TILE_V/128) and the output
-- accumulators (TILE_V/2), plus ~120 for the scores, score mask, P operand, addresses and the rest.
-- Fitted to ptxas -v over the whole space (sm_90a, CUDA 13.0, bf16, docs/notes/la_fwd.md): every
-- configuration with state + accumulators ≤ 128 (64 x 128, 128 x 64, 192 x 64, 256 x 32) compiles
-- without spills at ≤ 237 registers; the next ones (128 x 128: 192, 256 x 64: 160) spill.
-- D = 192 (three 16-byte pieces per row and thread in the loads) with a state read or written
-- or varlen addressing takes ~8 more: 192 x 64 with all three spilled 220 bytes at 255 registers
-- (la_fwd_sm90's varlen problem, f16, WGS = 2).
-- With ds: a second state Y and its accumulators, and without SPLIT_QK the P' operand (16) and
-- ~24 for the masks read from λ^k's table, Y's scaling and the reduction; 8 more with two
-- warpgroups, 4 with three stages and no PREFETCH, 8 with varlen or VK addressing. Fitted to
-- the same sweeps (sm_90a, f16 and bf16, D and E 64..256): D = 128 with TILE_V = 32 and one
-- warpgroup spills 12 bytes at 255 registers, so it is out; with SPLIT_QK the scores leave the
-- registers (D = 128, TILE_V = 32: 210-222).
local function regs(cfg, problem)
    local extra = (problem.D % 128 ~= 0
                   and (problem.has_initial or problem.has_final or problem.varlen)) and 8 or 0
    local ds = 0
    if problem.ds and cfg.SPLIT_QK == 1 then
        ds = problem.D * cfg.TILE_V // 128 + cfg.TILE_V // 2 - 40
    elseif problem.ds then
        ds = problem.D * cfg.TILE_V // 128 + cfg.TILE_V // 2 + 40 + (cfg.WGS == 2 and 8 or 0)
             + ((cfg.STAGES == 3 and cfg.PREFETCH == 0) and 4 or 0)
             + ((problem.varlen or problem.vk) and 8 or 0)
    end
    return problem.D * cfg.TILE_V // 128 + cfg.TILE_V // 2 + 120 + extra + ds
end

-- SPLIT > 1 holds what the second walk needs across the first (the segment's bounds, addresses)
-- and forms S_in: ~20 more registers by ptxas -v (sm_90a, CUDA 13.0, bf16, D = 128, TILE_V = 64,
-- SPLIT_QK: 170 -> 191); more with whole scores in the registers (128 x 64 with one warpgroup
-- spills 4-8 bytes, with two 16-24) and at D = 256 (256 x 32 spills with SPLIT_QK too): the
-- compile sweep's findings.
local function split_regs(cfg, problem)
    if cfg.SPLIT == 1 then return 0 end
    local whole_scores = cfg.SPLIT_QK == 0 and (cfg.WGS == 2 and 40 or 16) or 0
    return 24 + whole_scores + (problem.D >= 256 and 32 or 0)
end

local function valid(cfg, problem, device)
    if device.arch ~= "sm_90a" then return false, "wgmma needs sm_90a" end
    if ELEM[problem.dtype] == nil then
        return false, "f16 and bf16 only (fp32 goes to la_fwd: tf32 wgmma has no transposed operands)"
    end
    if spec.out_dtype(problem) ~= problem.dtype then
        return false, "o must have the inputs' dtype (a mixed call goes to la_fwd)"
    end
    if spec.ELEM[spec.state_dtype(problem)] == nil then
        return false, "state_dtype must be f32, f16 or bf16"
    end
    local D, E = problem.D, problem.E
    if D % 64 ~= 0 or D > 256 then return false, "D must be 64, 128, 192 or 256 (the m64 blocks of the state)" end
    if E % 16 ~= 0 or E < 16 or E > 256 then return false, "E must be a multiple of 16 from 16 to 256" end
    if cfg.BLOCK ~= 64 then return false, "BLOCK must be 64 (the wgmma M of one warpgroup)" end
    if cfg.SPLIT_QK == 1 and cfg.WGS ~= 2 then
        return false, "SPLIT_QK splits Q Kᵀ between two warpgroups (WGS = 2)"
    end
    if cfg.PREFETCH == 1 and cfg.STAGES < 3 then
        return false, "PREFETCH needs STAGES >= 3 (chunk c + 1 must have landed by mid-chunk c)"
    end
    if problem.state_only and (not problem.has_final or problem.ds) then
        return false, "state_only computes S_N (has_final), without ds"
    end
    if problem.ds then
        if not problem.decay then return false, "ds needs the decay path" end
        if cfg.SPLIT_QK == 0 and problem.D > 128 then
            -- (the scores, P and P' in registers beside three or four m64 blocks of S and Y
            -- spill at every width: measured by the compile sweep)
            return false, "ds with D > 128 splits Q Kᵀ (SPLIT_QK = 1)"
        end
        -- One share per CTA in the workspace, which holds E_op / 16 per (sequence, head): the
        -- scan's E here is the op's D.
        if problem.E // (cfg.WGS * cfg.TILE_V) > problem.ds_slots then
            return false, string.format("%d ds shares per head exceed the workspace's %d",
                                        problem.E // (cfg.WGS * cfg.TILE_V), problem.ds_slots)
        end
    end
    local ok, why = spec.check_tile(cfg.WGS * cfg.TILE_V, E, "WGS*TILE_V")
    if not ok then return false, why end
    local r = regs(cfg, problem) + split_regs(cfg, problem)
    if r > 255 then
        return false, string.format("about %d registers per thread needed (255 allowed)", r)
    end
    if cfg.SPLIT > 1 then
        if problem.ds then return false, "ds walks whole sequences (SPLIT = 1)" end
        -- A sequence long enough for SPLIT segments of SEG_MIN tokens (varlen: N is the packed
        -- length, the longest a sequence can be); a whole-sequence grid that leaves half the
        -- SMs idle, and at most four CTAs per SM with the split (beyond that a split only adds
        -- the second read and the local states).
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
    return spec.check_smem(smem(cfg, problem) + static_smem(cfg, problem), device)
end

-- How many CTAs of this configuration an SM holds at once (shared memory, and no more than the
-- grid gives each SM).
local function resident(cfg, problem, device, per_sm)
    return math.min(per_sm, device.smem_per_sm // (smem(cfg, problem) + 1024))
end

-- The backward's dq pass with ds holds a second state, so the widest slice that fits is
-- narrower; two warpgroups splitting Q Kᵀ keep the scores (and P') out of the registers.
local function ds_default(problem, device)
    for _, tv in ipairs({ 64, 32, 16 }) do
        for _, deep in ipairs({ { STAGES = 3, PREFETCH = 1 }, { STAGES = 2, PREFETCH = 0 } }) do
            local cfg = with({ BLOCK = 64, TILE_V = tv, WGS = 2, SPLIT_QK = 1, SPLIT = 1 }, deep)
            if valid(cfg, problem, device) then return cfg end
        end
    end
    for _, tv in ipairs({ 32, 16 }) do
        local cfg = { BLOCK = 64, TILE_V = tv, WGS = 1, STAGES = 2, PREFETCH = 0, SPLIT_QK = 0, SPLIT = 1 }
        if valid(cfg, problem, device) then return cfg end
    end
    return { BLOCK = 64, TILE_V = 16, WGS = 1, STAGES = 2, PREFETCH = 0, SPLIT_QK = 0, SPLIT = 1 }
end

-- The whole-sequence configuration (SPLIT = 1): the widest slice (64 columns) whose state and
-- accumulators fit the registers, while the grid still covers half the SMs; narrower slices when
-- B·H is small (and 32 at D = 256). Two warpgroups over the same Q/K tiles when E holds two slices
-- and the grid still covers the SMs; a third stage and PREFETCH when that costs no CTA its place
-- on the SM (one CTA per SM either way at D >= 128); SPLIT_QK with two warpgroups when PREFETCH
-- hides its barrier, and at D = 256 where Q Kᵀ is the largest product. H200, bf16, B = 4, H = 32,
-- N = 8192, `lajit tune` over the whole space (docs/notes/la_fwd.md): the defaults are the
-- winners at D = 256 (1.440 ms), 192 (0.665) and 128 (0.296); D = 64 (one warpgroup: E = 64
-- holds one slice) 0.153 against the winner's 0.148 (no PREFETCH).
local function whole_default(problem, device)
    local bh = 1 << log2_bucket(problem.B * problem.H)
    local cfg = { BLOCK = 64, TILE_V = 64, WGS = 1, STAGES = 2, PREFETCH = 0, SPLIT_QK = 0, SPLIT = 1 }
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
    if smem(deep, problem) + (problem.ds and DS_STATIC or 0) <= device.smem_optin
        and resident(deep, problem, device, per_sm) >= resident(cfg, problem, device, per_sm) then
        cfg = deep
    end
    if cfg.WGS == 2 and (cfg.PREFETCH == 1 or problem.D >= 256) then
        local halves = with(cfg, { SPLIT_QK = 1 })
        if smem(halves, problem) <= device.smem_optin then cfg = halves end
    end
    return cfg
end

-- Segments per sequence for a configuration: when the whole-sequence grid of wide slices leaves
-- three quarters of the SMs idle or more (H200, B = 1, H = 64, D = 128, 64 such CTAs: two
-- segments measured 1.63 ms against 1.38 whole) and the sequences are long enough (SEG_MIN tokens per segment, N / B on average
-- in a varlen batch), the fewest (a power of two) that give ~every SM a CTA. With fewer idle SMs
-- the second read of K and V costs more than the SMs bring (docs/notes/split.md).
-- Tokens per segment of a sequence cut in `split` (varlen: the average sequence).
local LONG_SEG = 16384
local function per_seg(problem, split)
    return problem.N // math.max(problem.varlen and problem.B or 1, 1) // split
end

local function split_default(cfg, problem, device)
    local per_seq = problem.N // math.max(problem.varlen and problem.B or 1, 1)
    local ctas = problem.B * problem.H * (problem.E // (cfg.WGS * cfg.TILE_V))
    if 4 * ctas > device.sms then return 1 end
    local split = 1
    while split < 128 and 10 * ctas * split < 9 * device.sms and per_seq >= 2 * split * SEG_MIN do
        split = split * 2
    end
    return split
end

-- A split configuration keeps the widest slices (K and V are read once per slice, twice with a
-- split): 64 columns per warpgroup, two warpgroups sharing Q/K and splitting Q Kᵀ when E holds
-- them (SPLIT_QK keeps the scores out of the registers the split's second walk needs), three
-- stages with PREFETCH when they fit; nil when the problem is not worth splitting.
local function split_config(problem, device)
    for _, tv in ipairs({ 64, 32, 16 }) do
        if tv <= problem.E and problem.E % tv == 0 then
            local two = problem.E % (2 * tv) == 0
            local cfg = { BLOCK = 64, TILE_V = tv, WGS = two and 2 or 1, SPLIT_QK = two and 1 or 0,
                          STAGES = 3, PREFETCH = 1, SPLIT = 1 }
            cfg.SPLIT = split_default(cfg, problem, device)
            if cfg.SPLIT == 1 then return nil end
            -- Each segment reads the local states before it: beyond 32 segments narrower
            -- slices (smaller states) fill the SMs for less, unless the segments stay long
            -- (H200, B = 1, N = 1M, `lajit tune`: H = 1 64 segments of 32 columns 0.732 ms
            -- against 32 of 16 columns 1.076; H = 2 64 of 64 columns 1.089 against 32 of 32
            -- 1.278; at N = 64K, 1K-token segments, the narrower 32 win: docs/notes/split.md).
            if cfg.SPLIT > 32 and per_seg(problem, cfg.SPLIT) < LONG_SEG and tv > 16
                and problem.E % (tv // 2) == 0 then goto narrower end
            for _, deep in ipairs({ { STAGES = 3, PREFETCH = 1 }, { STAGES = 2, PREFETCH = 0 } }) do
                local c = with(cfg, deep)
                if valid(c, problem, device) then return c end
            end
        end
        ::narrower::
    end
    return nil
end

local function default(problem, device)
    if problem.ds then return ds_default(problem, device) end
    return split_config(problem, device) or whole_default(problem, device)
end

return {
    name = "la_fwd_sm90",
    op = "fwd",
    archs = { "sm_90a" },                -- the op's default list skips it elsewhere

    params = {
        BLOCK = { 64 },                  -- tokens per chunk: the M of one warpgroup's wgmma
        TILE_V = { 16, 32, 64, 128 },    -- E columns per warpgroup
        WGS = { 1, 2 },                  -- warpgroups per CTA, sharing the Q and K tiles
        STAGES = { 2, 3 },               -- chunks in flight in the cp.async ring
        PREFETCH = { 0, 1 },             -- Q Kᵀ of the next chunk issued during this chunk's tail
        SPLIT_QK = { 0, 1 },             -- two warpgroups compute half of Q Kᵀ each, P shared
        SPLIT = { 1, 2, 4, 8, 16, 32, 64, 128 }, -- segments per sequence (common/split.cuh)
    },

    problems = {
        { op = "fwd", dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128, decay = true,
          has_initial = false, has_final = false, varlen = false, vk = false },
        { op = "fwd", dtype = "bf16", B = 4, H = 32, N = 8192, D = 64, E = 64, decay = true,
          has_initial = false, has_final = false, varlen = false, vk = false },
        { op = "fwd", dtype = "bf16", B = 4, H = 32, N = 8192, D = 256, E = 256, decay = true,
          has_initial = false, has_final = false, varlen = false, vk = false },
        { op = "fwd", dtype = "f16", B = 2, H = 8, N = 2048, D = 192, E = 96, decay = false,
          has_initial = true, has_final = true, varlen = false, vk = false },
        { op = "fwd", dtype = "f16", B = 8, H = 16, N = 4096, D = 192, E = 256, decay = true,
          has_initial = true, has_final = true, varlen = true, vk = true },
        -- Few heads, long sequences: the SPLIT configurations (with states, varlen, VK).
        { op = "fwd", dtype = "bf16", B = 1, H = 2, N = 65536, D = 128, E = 128, decay = true,
          has_initial = true, has_final = true, varlen = false, vk = false },
        { op = "fwd", dtype = "f16", B = 2, H = 1, N = 32768, D = 256, E = 64, decay = true,
          has_initial = true, has_final = true, varlen = true, vk = true },
    },

    valid = valid,
    default = default,

    key = spec.fwd_key,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // (cfg.WGS * cfg.TILE_V) * cfg.SPLIT, "H", problem.varlen and "nseq" or "B" },
            block = { 128 * cfg.WGS, 1, 1 },
            smem = smem(cfg, problem),
            entry = "la_fwd_sm90",
            split_ws = cfg.SPLIT > 1 and split_ws(cfg, problem) or nil, -- bytes per (sequence, head)
            split_flags = cfg.SPLIT > 1 and split_flags(cfg, problem) or nil,
            covers = problem.ds and { 3 } or nil,  -- the backward's ds (part 3) computed here
        }
    end,

    -- What a compile may use (the compile sweep checks it): 255 registers (one CTA of at most
    -- 256 threads per SM), and the dynamic shared memory launch() asks for (no static).
    resources = function(cfg, problem, device)
        return { regs = 255, smem = smem(cfg, problem) + static_smem(cfg, problem) }
    end,

    source = function(cfg, problem, device)
        local consts = spec.scan_consts(problem, ELEM)
        consts.PREFETCH = cfg.PREFETCH
        consts.DS = spec.b(problem.ds)
        consts.HAS_DSN = spec.b(problem.ds and problem.has_dsn)
        consts.SMEM = smem(cfg, problem)
        consts.SPLIT = cfg.SPLIT
        consts.SEG_MIN = SEG_MIN
        consts.WS_PER = split_ws(cfg, problem)
        consts.FLAGS_PER = split_flags(cfg, problem)
        return { template = "la_fwd_sm90/fwd.cu", consts = consts }
    end,
}
