-- family.lua — la_fwd: the chunked forward on tensor cores (mma.sync, sm_80 and newer; fwd.cu).
-- State registers per thread: 4 per 16×8 state tile dealt to a warp; the CTA has BLOCK/16 warps.
-- 16-bit inputs (f16, bf16); fp32 inputs need the tf32 path, not written yet: valid() says so and
-- the op's default falls back to la_recurrent for them.

local ELEM = { f16 = "lj_f16", bf16 = "lj_bf16" }

local function log2_bucket(x)
    local b = 0
    while (1 << (b + 1)) <= x do b = b + 1 end
    return b
end

-- Bytes of fwd.cu's struct Smem: Q, K [BLOCK][D+8], Kt [D][BLOCK+8], Vt [TILE_V][BLOCK+8],
-- St [TILE_V][D+8] (16-bit), then BLOCK+1 floats (plus alignment slack).
local function smem(cfg, problem)
    local D, B, T = problem.D, cfg.BLOCK, cfg.TILE_V
    local halves = 2 * B * (D + 8) + D * (B + 8) + T * (B + 8) + T * (D + 8)
    return 2 * halves + 4 * (B + 1) + 16
end

local function state_regs(cfg, problem)
    local tiles = (problem.D // 16) * (cfg.TILE_V // 8)
    local warps = cfg.BLOCK // 16
    return 4 * ((tiles + warps - 1) // warps)
end

return {
    name = "la_fwd",
    op = "fwd",

    params = {
        BLOCK = { 32, 64 },      -- chunk length, one warp per 16 rows: 32 halves the staging memory
        TILE_V = { 16, 32, 64 }, -- E columns per CTA: more CTAs and fewer state registers when small
    },

    problems = {
        { dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128, decay = true },
        { dtype = "bf16", B = 4, H = 32, N = 8192, D = 64, E = 64, decay = true },
        { dtype = "f16", B = 2, H = 4, N = 913, D = 96, E = 64, decay = false, has_initial = true,
          has_final = true, vk = true },
        { dtype = "f16", B = 3, H = 8, N = 4096, D = 256, E = 256, decay = true, varlen = true,
          has_initial = true, has_final = true },
    },

    valid = function(cfg, problem, device)
        if ELEM[problem.dtype] == nil then
            return false, "fp32 inputs need the tf32 path, not written yet (la_recurrent runs them)"
        end
        if device.cc < 80 then return false, "mma.sync m16n8k16 with bf16 needs sm_80 or newer" end
        local D, E = problem.D, problem.E
        if D % 16 ~= 0 or E % 16 ~= 0 or D < 16 or E < 16 or D > 256 or E > 256 then
            return false, "D and E must be multiples of 16 from 16 to 256"
        end
        if cfg.TILE_V > E or E % cfg.TILE_V ~= 0 then
            return false, string.format("TILE_V=%d does not divide E=%d", cfg.TILE_V, E)
        end
        if state_regs(cfg, problem) > 64 then
            return false, string.format("%d state registers per thread (limit 64)", state_regs(cfg, problem))
        end
        local bytes = smem(cfg, problem)
        if bytes > device.smem_optin then
            return false, string.format("%d bytes of shared memory (device allows %d)", bytes, device.smem_optin)
        end
        return true
    end,

    -- The widest E tile that fits (fewer recomputations of Q Kᵀ), unless the grid would leave
    -- SMs idle: then narrower tiles for more CTAs.
    default = function(problem, device)
        local cfg = { BLOCK = 64, TILE_V = 64 }
        local function fits(c)
            return problem.E % c.TILE_V == 0 and c.TILE_V <= problem.E and state_regs(c, problem) <= 64
                and smem(c, problem) <= device.smem_optin
        end
        while cfg.TILE_V > 16 and not fits(cfg) do cfg.TILE_V = cfg.TILE_V // 2 end
        if not fits(cfg) then cfg.BLOCK = 32 end
        while cfg.TILE_V > 16 and problem.B * problem.H * (problem.E // cfg.TILE_V) < device.sms do
            cfg.TILE_V = cfg.TILE_V // 2
        end
        return cfg
    end,

    key = function(problem)
        return string.format("%s_D%d_E%d_%s%s%s%s%s_n%d_bh%d", problem.dtype, problem.D, problem.E,
                             problem.decay and "decay" or "nodecay",
                             problem.has_initial and "_s0" or "", problem.has_final and "_sn" or "",
                             problem.varlen and "_varlen" or "", problem.vk and "_vk" or "",
                             log2_bucket(problem.N), log2_bucket(problem.B * problem.H))
    end,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // cfg.TILE_V, "H", "B" },
            block = { cfg.BLOCK // 16 * 32, 1, 1 },
            smem = smem(cfg, problem),
            entry = "la_fwd",
        }
    end,

    source = function(cfg, problem, device)
        return { template = "la_fwd/fwd.cu", consts = { ELEM = ELEM[problem.dtype] } }
    end,
}
