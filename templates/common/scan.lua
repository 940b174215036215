-- scan.lua — the launch arithmetic of the chunk-scan kernel la_fwd/fwd.cu, shared by the
-- families that run it: la_fwd (the forward) and la_bwd (whose dq, dk and dv passes are the same
-- scan over permuted inputs). `problem` here is the scan's own shape: dtype, D (width of the
-- "q" and "k" rows), E (width of the "v" rows and of the output).

local spec = import("common/spec.lua")
local ELEM, ESIZE, log2_bucket = spec.ELEM, spec.ESIZE, spec.log2_bucket

-- Warp geometry: computed here once and handed to fwd.cu as constants (geometry_consts below),
-- which the kernel checks with static_asserts instead of recomputing.
local function geometry(cfg, problem)
    local D, TV, W = problem.D, cfg.TILE_V, cfg.WARPS
    local rt = cfg.BLOCK // 16
    local om = math.min(W, rt)
    local on = W // om
    local g = { rt = rt, om = om, on = on, ort = rt // om, ont = (TV // 8) // on }
    -- State split: SN warp columns chosen to minimise fragment loads (fwd.cu pick_sn()).
    local function cost(sn)
        local smw = W // sn
        return (D // 16 + smw - 1) // smw + ((TV // 8) // sn + 1) // 2
    end
    local sn, s = 1, 2
    while s <= W and s <= TV // 8 do
        if cost(s) <= cost(sn) then sn = s end
        s = s * 2
    end
    g.sn = sn
    g.smw = W // sn
    g.snt = (TV // 8) // sn
    g.smt = (D // 16 + g.smw - 1) // g.smw
    -- Registers a thread holds across the chunk loop: the state tiles, the output and score
    -- accumulators of each of its ORT row tiles (2 for 2 warps at BLOCK = 64: both stay live; a
    -- count of one spilled la_bwd's dv pass at D = E = 64 at 255 registers), plus addressing and
    -- fragments (64, 96 for tf32, from ptxas reports: f16 D = 256 with 128 state floats per thread
    -- spilled at 255 registers).
    -- Varlen with 128 state floats per thread holds the slot decoding and packed-token
    -- addressing on top (f16, D = 256, VK, states, BLOCK = 32, TILE_V = 64, 4 warps: modelled
    -- 224, spilled 8 bytes at 255 on sm_100a after fresh slots added a decode).
    g.regs = 4 * g.smt * g.snt + g.ort * (4 * g.ont + 4 * (cfg.BLOCK // 8))
        + (problem.dtype == "f32" and 96 or 64)
        + ((problem.varlen and 4 * g.smt * g.snt >= 128) and 32 or 0)
    return g
end

-- Dynamic shared memory: the Q, K, V ring, the 16-bit (fp32 for f32) state copy, the λ^k table.
local function smem(cfg, problem)
    local es = ESIZE[problem.dtype]
    local ve = 16 // es
    local ldq, ldv = problem.D + ve, cfg.TILE_V + ve
    return cfg.STAGES * (2 * cfg.BLOCK * ldq + cfg.BLOCK * ldv) * es + problem.D * ldv * es
        + (cfg.BLOCK + 1) * 4
end

-- The registers a thread may use: what __launch_bounds__(threads, MINB) gives ptxas.
local function reg_cap(cfg, device)
    return spec.reg_cap(device, cfg.WARPS * 32, cfg.MINB)
end

local function valid(cfg, problem, device)
    -- state_only (fwd.cu STATE_ONLY): a forward with o NULL (S_N alone), or la_bwd's dv pass
    -- without dv (dS_0 alone: lajit_attn_bwd with dq, dk, dv NULL).
    if problem.state_only and not problem.has_final then
        return false, "state_only computes S_N (has_final)"
    end
    local ok, why = spec.check_dtype(problem)
    if ok then ok, why = spec.check_io_dtypes(problem) end
    if ok then ok, why = spec.check_dims(problem) end
    if ok then ok, why = spec.check_tile(cfg.TILE_V, problem.E) end
    if not ok then return false, why end
    local g = geometry(cfg, problem)
    if g.ont < 1 or (cfg.TILE_V // 8) % g.on ~= 0 then
        return false, string.format("%d warp columns cannot split TILE_V=%d into 8-column tiles",
                                    g.on, cfg.TILE_V)
    end
    if cfg.MINB > 1 and cfg.WARPS * 32 * cfg.MINB > 512 then
        return false, "MINB=2 is for CTAs of at most 256 threads"
    end
    local cap = reg_cap(cfg, device)
    -- The model undercounts 2-warp CTAs: every one the compile sweep saw spill at 255 registers
    -- (f32 D = 96, f16 D = 256, bf16 D = 64 with two row tiles) modelled 200-256; keep 64 spare.
    if cfg.WARPS == 2 then cap = math.min(cap, 192) end
    if g.regs > cap then
        return false, string.format("about %d registers per thread needed, %d allowed (spills)",
                                    g.regs, cap)
    end
    local bytes = smem(cfg, problem)
    ok, why = spec.check_smem(bytes, device)
    if not ok then return false, why end
    -- 1 KiB per CTA is reserved by the hardware.
    if cfg.MINB * (bytes + 1024) > device.smem_per_sm then
        return false, string.format("MINB=%d CTAs of %d bytes exceed %d bytes per SM", cfg.MINB,
                                    bytes, device.smem_per_sm)
    end
    return true
end

-- The candidate order default() falls back through when its first choice does not fit a device
-- (small shared memory on sm_120, wide D): fewer stages, then shorter chunks, then narrower tiles.
local function fit(cfg, problem, device)
    local tries = {}
    for _, tv in ipairs({ cfg.TILE_V, 64, 32, 16 }) do
        for _, bl in ipairs({ cfg.BLOCK, 64, 32, 16 }) do
            for _, w in ipairs({ cfg.WARPS, 4, 8, 2 }) do
                for _, st in ipairs({ cfg.STAGES, 2 }) do
                    tries[#tries + 1] = { BLOCK = bl, TILE_V = tv, WARPS = w, STAGES = st, MINB = 1 }
                end
            end
        end
    end
    table.insert(tries, 1, cfg)
    for _, c in ipairs(tries) do
        if c.TILE_V <= problem.E and problem.E % c.TILE_V == 0 and valid(c, problem, device) then
            return c
        end
    end
    return cfg -- nothing fits: valid() will say why
end

-- Measured on an H200 (132 SMs, docs/notes/la_fwd.md), bf16, B = 4, H = 32, decay: at
-- D = E = 128 one 8-warp CTA per (b, h) with all 128 columns (BLOCK = 64) beat two 4-warp
-- CTAs with 64-column slices (0.570 vs 0.600 ms at N = 8192); at D = E = 64 BLOCK = 32 with
-- 64-column tiles and 4 warps was best (0.275 ms, against 0.284–0.305 for the others). Two
-- stages: a third costs a CTA per SM and was never faster. f16 takes bf16's rule (same size,
-- same mma rate; not swept on its own). Fewer (b, h) than half the SMs want narrower slices so
-- the grid still covers the GPU. Thresholds use the log2 bucket of B·H, as key() does, so one
-- bucket always gets one config.
--
-- f32 (tf32, issue 23, docs/notes/la_fwd.md "fp32 default"): 16-token chunks over the whole E
-- (up to 128 columns) with 4 warps. Measured (H200, B = 4, H = 64, D = E = 128): the former rule,
-- BLOCK 64 with 32-column slices, ran 8.50 ms at N = 8192; BLOCK 16, TILE_V 128 with 8 warps
-- 3.13 ms, with 4 warps 2.72 ms (`lajit tune`'s winner at N = 1024 and 8192, 0.36 and 2.72 ms).
-- Narrow slices make each of E/TILE_V CTAs recompute the chunk's Q Kᵀ at half the 16-bit mma
-- rate, and at 4 bytes an element a 64-token chunk of full width does not fit (270 KB); 16
-- tokens do (118 KB, 232 registers at 4 warps). Not swept over other D, E, B·H.
local function default(problem, device)
    local bh = 1 << log2_bucket(problem.B * problem.H)
    local cfg
    if problem.dtype == "f32" then
        cfg = { BLOCK = 16, TILE_V = 128, WARPS = 4, STAGES = 2, MINB = 1 }
    elseif problem.D <= 64 then
        cfg = { BLOCK = 32, TILE_V = 64, WARPS = 4, STAGES = 2, MINB = 1 }
    else
        cfg = { BLOCK = 64, TILE_V = 128, WARPS = 8, STAGES = 2, MINB = 1 }
    end
    while cfg.TILE_V > problem.E or problem.E % cfg.TILE_V ~= 0 do
        cfg.TILE_V = cfg.TILE_V // 2
    end
    while cfg.TILE_V > 16 and bh * (problem.E // cfg.TILE_V) * 2 < device.sms do
        cfg.TILE_V = cfg.TILE_V // 2
    end
    return fit(cfg, problem, device)
end

-- The derived geometry fwd.cu takes as constants: the output split (OM warp rows), the state
-- split (SN warp columns) and the dynamic shared memory its layout must fit in (SMEM).
local function geometry_consts(cfg, problem, consts)
    local g = geometry(cfg, problem)
    consts.OM = g.om
    consts.SN = g.sn
    consts.SMEM = smem(cfg, problem)
    return consts
end

-- What a compile of the scan may use (the compile sweep checks the report against it): no more
-- registers than the launch bounds allow, no more shared memory than launch() asks for (the
-- kernel has no static shared memory).
local function resources(cfg, problem, device)
    return { regs = reg_cap(cfg, device), smem = smem(cfg, problem) }
end

return {
    ELEM = ELEM,
    geometry_consts = geometry_consts,
    resources = resources,
    default = default,
    ESIZE = ESIZE,
    log2_bucket = log2_bucket,
    geometry = geometry,
    smem = smem,
    valid = valid,
    fit = fit,
}
