-- family.lua — la_fwd: the chunked Lightning Attention forward (fwd.cu says how the kernel works;
-- docs/notes/la_fwd.md has the measurements behind the choices below).
--
-- One CTA per (E slice of TILE_V columns, head, sequence): grid {E / TILE_V, H, B or nseq}. The
-- state slice lives in registers for the whole sequence; Q, K, V chunks of BLOCK tokens stream
-- through a STAGES-deep cp.async ring in shared memory.

local spec = import("common/spec.lua")
local scan = import("common/scan.lua")
local smem, valid = scan.smem, scan.valid

return {
    name = "la_fwd",
    op = "fwd",

    -- The space is trimmed (BLOCK 128, TILE_V 256, STAGES 3, MINB 2 left out) so the exhaustive
    -- compile sweep of the CPU tests stays within CI's time; a third stage was never faster
    -- (docs/notes/la_fwd.md). The tuner (issue 7) is where a wider space pays.
    params = {
        BLOCK = { 16, 32, 64 },              -- tokens per chunk: longer amortises state work, costs smem
        TILE_V = { 16, 32, 64, 128 },        -- E columns per CTA: narrower = more CTAs, more Q Kᵀ recompute
        WARPS = { 2, 4, 8 },
        STAGES = { 2 },                      -- chunks in flight in the cp.async ring
        MINB = { 1 },                        -- CTAs per SM the register allocation must allow
    },

    problems = {
        { op = "fwd", dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128, decay = true,
          has_initial = false, has_final = false, varlen = false, vk = false },
        { op = "fwd", dtype = "bf16", B = 4, H = 32, N = 8192, D = 64, E = 64, decay = true,
          has_initial = false, has_final = false, varlen = false, vk = false },
        { op = "fwd", dtype = "f32", B = 2, H = 8, N = 2048, D = 96, E = 64, decay = false,
          has_initial = true, has_final = true, varlen = false, vk = false },
        { op = "fwd", dtype = "f16", B = 8, H = 16, N = 4096, D = 256, E = 256, decay = true,
          has_initial = true, has_final = true, varlen = true, vk = true },
        -- o NULL: the final state only (fwd.cu STATE_ONLY), a span's local state (issue 16).
        { op = "fwd", dtype = "bf16", B = 1, H = 16, N = 4096, D = 128, E = 128, decay = true,
          has_initial = true, has_final = true, varlen = true, vk = true, state_only = true },
    },

    valid = valid,

    -- The heuristic is the scan's (common/scan.lua), shared with la_bwd's passes.
    default = scan.default,

    key = spec.fwd_key,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // cfg.TILE_V, "H", problem.varlen and "nseq" or "B" },
            block = { cfg.WARPS * 32, 1, 1 },
            smem = smem(cfg, problem),
            entry = "la_fwd",
        }
    end,

    resources = scan.resources,

    source = function(cfg, problem, device)
        return {
            template = "la_fwd/fwd.cu",
            consts = scan.geometry_consts(cfg, problem, spec.scan_consts(problem)),
        }
    end,
}
