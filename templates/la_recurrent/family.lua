-- family.lua — la_recurrent: the exact recurrence of DESIGN.md, one token at a time (forward).
-- The oracle of the fast families and the first family of the data path: simple, fp32
-- throughout, any D, E multiple of 16 up to 256, every dtype, layout and state option.

local spec = import("common/spec.lua")
local ELEM = spec.ELEM

local function split(cfg, problem)
    local threads = cfg.WARPS * 32
    local rows = threads // cfg.TILE_V -- row groups
    return threads, rows
end

-- Static shared memory of recurrent.cu: q, k and the v tile of one token, and the partial sums.
local function smem(cfg, problem)
    local _, rows = split(cfg, problem)
    return 4 * (2 * problem.D + cfg.TILE_V + rows * cfg.TILE_V)
end

-- The minimum CTAs per SM of __launch_bounds__ (empty: none named). On sm_120 ptxas held a 4-warp
-- CTA with 32 state values per thread to 72 registers and spilled (bf16 D = E = 128, TILE_V = 32,
-- compile sweep); naming one CTA lets it take 154. With 128 state values per thread the same
-- hint made it spill instead, so only up to 64.
local function min_ctas(cfg, problem, device)
    local _, rows = split(cfg, problem)
    return (device.cc >= 120 and problem.D // rows <= 64) and ", 1" or ""
end

return {
    name = "la_recurrent",
    op = "fwd",

    params = {
        TILE_V = { 16, 32, 64, 128 }, -- E columns per CTA: smaller = more CTAs when B*H is small
        WARPS = { 1, 2, 4, 8 },       -- with TILE_V, the state values each thread keeps (D / rows)
    },

    problems = {
        { dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128, decay = true,
          has_initial = true, has_final = true },
        { dtype = "f32", B = 2, H = 4, N = 913, D = 64, E = 32, decay = false },
        { dtype = "f16", B = 3, H = 8, N = 4096, D = 256, E = 256, decay = true, vk = true,
          varlen = true, has_initial = true, has_final = true },
        { dtype = "bf16", B = 1, H = 1, N = 1, D = 16, E = 16, decay = true },
    },

    valid = function(cfg, problem, device)
        if problem.state_only then return false, "state_only (no o) is served by la_fwd_sm90" end
        local ok, why = spec.check_dtype(problem)
        if ok then ok, why = spec.check_io_dtypes(problem) end
        if ok then ok, why = spec.check_dims(problem) end
        if ok then ok, why = spec.check_tile(cfg.TILE_V, problem.E) end
        if not ok then return false, why end
        local D = problem.D
        local threads, rows = split(cfg, problem)
        if threads < cfg.TILE_V or threads % cfg.TILE_V ~= 0 then
            return false, string.format("%d threads cannot cover %d columns", threads, cfg.TILE_V)
        end
        if D % rows ~= 0 then
            return false, string.format("%d row groups do not divide D=%d", rows, D)
        end
        if D // rows > 128 then
            return false, string.format("%d state values per thread (limit 128 registers)", D // rows)
        end
        if D // rows < 2 then
            return false, string.format("%d row groups for D=%d leave threads idle", rows, D)
        end
        local bytes = smem(cfg, problem)
        if bytes > 48 * 1024 then
            return false, string.format("%d bytes of static shared memory (limit 48 KiB)", bytes)
        end
        return true
    end,

    -- About 32 state values per thread and 32 columns per CTA: enough CTAs for the GPU at
    -- ordinary B*H, few registers. The oracle's speed does not matter much.
    default = function(problem, device)
        local tile = problem.E % 32 == 0 and 32 or 16
        -- Row groups: the largest power of two up to D / 32 (powers of two divide D, a multiple
        -- of 16), so WARPS stays a power of two from the parameter list.
        local rows = 1
        while rows * 2 <= problem.D // 32 do rows = rows * 2 end
        local warps = math.max(1, (tile * rows) // 32)
        while warps > 8 do warps = warps // 2 end
        return { TILE_V = tile, WARPS = warps }
    end,

    key = function(problem)
        return string.format("%s_D%d_E%d_%s%s%s%s%s%s", problem.dtype, problem.D, problem.E,
                             problem.decay and "decay" or "nodecay",
                             problem.has_initial and "_s0" or "", problem.has_final and "_sn" or "",
                             problem.varlen and "_varlen" or "", problem.vk and "_vk" or "",
                             spec.dtype_suffix(problem))
    end,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // cfg.TILE_V, "H", "B" },
            block = { cfg.WARPS * 32, 1, 1 },
            smem = 0,
            entry = "la_recurrent_fwd",
        }
    end,

    -- What a compile may use (the compile sweep checks it): the launch bounds' registers and the
    -- static shared memory counted above.
    resources = function(cfg, problem, device)
        return { regs = spec.reg_cap(device, cfg.WARPS * 32, 1), smem = smem(cfg, problem) }
    end,

    source = function(cfg, problem, device)
        local _, rows = split(cfg, problem)
        return {
            template = "la_recurrent/recurrent.cu",
            consts = { ELEM = ELEM[problem.dtype], STATE_T = ELEM[spec.state_dtype(problem)],
                       OUT_ELEM = ELEM[spec.out_dtype(problem)], R = rows, SMEM = smem(cfg, problem),
                       MIN_CTAS = min_ctas(cfg, problem, device) },
        }
    end,
}
