-- family.lua — la_bwd_sm90: the backward's three scans (dq, dv + dS₀, dk; la_bwd/family.lua says
-- what each computes) on Hopper's wgmma: the kernel of la_fwd_sm90 walked forward for dq and from
-- the last token (REVERSE) with the gradient state (GRAD_STATE) for dv and dk. Same space, same
-- validity and the same default heuristic as la_fwd_sm90, applied to each scan's own shape (dq and
-- dk swap D and E). The decay gradient (part 3) is not a scan: the op takes it from la_bwd, as it
-- takes every part this family does not serve (another arch, fp32, a scan D that is not a multiple
-- of 64). Except that the dq pass computes it too when it is wanted (la_fwd_sm90/fwd.cu's DS:
-- Y beside S, two more products per chunk, one more input read), and its launch says it
-- `covers` part 3, which the op then skips; la_bwd's walk remains for what this family does not
-- serve.
--
-- The dv pass computes dk too where it can (dkdv.cu: both reversed scans share one gradient state
-- and one read of q, k, v and dO; its launch `covers` part 2, which the op then skips): D = E = 64
-- or 128, with outputs, and enough heads (FUSE_MIN_BH sequences x heads, one CTA each) that the
-- three-pass path would not split the sequence; elsewhere the three passes as before.

local fwd = import("la_fwd_sm90/family.lua")
local bwd = import("la_bwd/family.lua")

local spec = import("common/spec.lua")

local PARTS = { [0] = "dq", [1] = "dv", [2] = "dk" }

-- The fused dv/dk pass (dkdv.cu). One CTA of two warpgroups per (sequence, head); below
-- FUSE_MIN_BH of them the three-pass path, whose scans spread each head over several CTAs (and
-- split long sequences), keeps more of the GPU busy: H200, bf16, N = 8192, fwd+bwd at B·H = 64
-- 0.855 ms fused against 0.720 apart (D = 128; D = 64 0.533 against 0.459), at B·H = 128 1.064
-- against 1.183 (D = 64 0.598 against 0.601). A rule on the problem alone, so that the tuning key
-- can say which kernel a bucket holds (docs/notes/la_bwd.md).
local FUSE_MIN_BH = 128
local function fused(problem)
    return problem.part == 1 and not problem.state_only
        and (problem.dtype == "f16" or problem.dtype == "bf16")
        and problem.D == problem.E and (problem.D == 64 or problem.D == 128)
        and problem.B * problem.H >= FUSE_MIN_BH
end

-- Its shared memory: STAGES chunks of K, Q, V and dO, G's 16-bit copy, the weighted dO, the two
-- P tiles, λ^k for k = 0..64, and 1 KiB to align the tiles to the swizzle period.
local function dkdv_smem(cfg, problem)
    local t = 64 * problem.D * 2
    return cfg.STAGES * 4 * t + problem.D * problem.E * 2 + t + 2 * 64 * 64 * 2 + 65 * 4 + 1024
end

-- Its configuration: the deepest ring that fits (the other parameters are fixed by the kernel).
local function dkdv_valid(cfg, problem, device)
    if device.arch ~= "sm_90a" then return false, "wgmma needs sm_90a" end
    if spec.out_dtype(problem) ~= problem.dtype then
        return false, "dv and dk must have the inputs' dtype"
    end
    if spec.state_dtype(problem) ~= "f32" then return false, "the backward's states are f32" end
    if cfg.BLOCK ~= 64 or cfg.WGS ~= 2 or cfg.TILE_V ~= problem.E // 2 or cfg.SPLIT ~= 1
        or cfg.SPLIT_QK ~= 0 or cfg.PREFETCH ~= 0 then
        return false, string.format("the fused dv/dk pass runs BLOCK=64 WGS=2 TILE_V=%d SPLIT=1 "
                                    .. "SPLIT_QK=0 PREFETCH=0", problem.E // 2)
    end
    return spec.check_smem(dkdv_smem(cfg, problem), device)
end

local function dkdv_default(problem, device)
    local cfg = { BLOCK = 64, TILE_V = problem.E // 2, WGS = 2, STAGES = 3, PREFETCH = 0,
                  SPLIT_QK = 0, SPLIT = 1 }
    if not dkdv_valid(cfg, problem, device) then cfg.STAGES = 2 end
    return cfg
end

-- The forward problem each scan is: its D and E, and the state flags its kernel uses (dq starts
-- from S₀ᵀ; dv and dk from dS_N; only dv writes a state, dS₀).
local function scan_problem(problem)
    local sp = {}
    for k, v in pairs(problem) do sp[k] = v end
    local part = problem.part
    if part == 0 or part == 2 then sp.D, sp.E = problem.E, problem.D end
    sp.op = "fwd"
    sp.has_initial = (part == 0 and problem.has_initial) or (part ~= 0 and problem.has_dsn) or false
    sp.has_final = (part == 1 and problem.has_final) or false
    -- The dq pass with ds: its kernel reads dS_N (for ds's last term) and writes one share per
    -- CTA into the op's workspace (lajit_attn_bwd_workspace_size: E / 16 per sequence and head).
    sp.ds = part == 0 and problem.want_ds or false
    sp.has_dsn = sp.ds and problem.has_dsn or false
    sp.ds_slots = (problem.E + 15) // 16
    return sp
end

return {
    name = "la_bwd_sm90",
    op = "bwd",
    archs = { "sm_90a" },
    uses = { "la_fwd_sm90", "la_bwd" },  -- its kernel, and la_bwd's bucket key (import below)
    roles = bwd.roles,                   -- the same passes; part 3 is served by la_bwd

    params = fwd.params,

    problems = {
        { op = "bwd", part = 0, dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128,
          decay = true, has_initial = true, has_dsn = true, want_ds = true },
        { op = "bwd", part = 0, dtype = "f16", B = 2, H = 8, N = 2048, D = 64, E = 192,
          decay = true, has_dsn = true, want_ds = true, varlen = true, vk = true },
        { op = "bwd", part = 1, dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128,
          decay = true, has_initial = true, has_final = true, has_dsn = true },
        -- The fused dv/dk pass (dkdv.cu) at its other width, varlen, VK, no decay.
        { op = "bwd", part = 1, dtype = "f16", B = 8, H = 16, N = 4096, D = 64, E = 64,
          decay = false, has_initial = true, has_final = true, has_dsn = true, varlen = true,
          vk = true },
        { op = "bwd", part = 2, dtype = "f16", B = 2, H = 8, N = 2048, D = 64, E = 192,
          decay = false, has_dsn = true, varlen = true, vk = true },
        -- Few heads, long sequences: the scans split (SPLIT > 1), reversed and forward.
        { op = "bwd", part = 1, dtype = "bf16", B = 1, H = 2, N = 65536, D = 128, E = 128,
          decay = true, has_initial = true, has_final = true, has_dsn = true },
        { op = "bwd", part = 0, dtype = "f16", B = 2, H = 1, N = 32768, D = 64, E = 128,
          decay = true, has_initial = true, varlen = true, vk = true },
        -- dS₀ alone (lajit_attn_bwd with dq, dk, dv NULL: a span's local gradient state), split.
        { op = "bwd", part = 1, dtype = "bf16", B = 1, H = 4, N = 65536, D = 128, E = 128,
          decay = true, has_final = true, state_only = true },
    },

    valid = function(cfg, problem, device)
        if PARTS[problem.part] == nil then
            return false, "the decay gradient (part 3) runs in la_bwd"
        end
        if problem.state_only and (problem.part ~= 1 or not problem.has_final) then
            return false, "state_only is the dv pass writing dS0 alone"
        end
        if fused(problem) then return dkdv_valid(cfg, problem, device) end
        return fwd.valid(cfg, scan_problem(problem), device)
    end,

    default = function(problem, device)
        if fused(problem) then return dkdv_default(problem, device) end
        local sp = scan_problem(problem)
        if sp.ds and sp.D == 64 and sp.E == 64 then
            -- The dq pass with ds at D = E = 64: two CTAs of one warpgroup per head instead of
            -- la_fwd_sm90's one CTA of two warpgroups splitting Q Kᵀ. H200, bf16, B = 4, H = 32,
            -- `lajit tune` (session 16, docs/notes/la_bwd.md): 0.298 against 0.336 ms at N = 8192,
            -- 0.0517 against 0.0557 at N = 1024, the winner at both.
            local cfg = { BLOCK = 64, TILE_V = 32, WGS = 1, STAGES = 3, PREFETCH = 1, SPLIT_QK = 0,
                          SPLIT = 1 }
            if fwd.valid(cfg, sp, device) then return cfg end
        end
        return fwd.default(sp, device)
    end,

    -- la_bwd's buckets, the dq pass with ds in its own (another kernel), and the fused dv/dk
    -- pass in its own.
    key = function(problem)
        local k = bwd.key(problem)
        if problem.part == 0 and problem.want_ds then
            k = k .. (problem.has_dsn and "_ds_dsn" or "_ds")
        end
        if fused(problem) then k = k .. "_dkdv" end
        return k
    end,

    launch = function(cfg, problem, device)
        if fused(problem) then
            return {
                grid = { 1, "H", problem.varlen and "nseq" or "B" },
                block = { 256, 1, 1 },
                smem = dkdv_smem(cfg, problem),
                entry = "la_bwd_sm90_dkdv",
                covers = { 2 },  -- dk (part 2) computed here
            }
        end
        return fwd.launch(cfg, scan_problem(problem), device)
    end,

    resources = function(cfg, problem, device)
        if fused(problem) then return { regs = 255, smem = dkdv_smem(cfg, problem) } end
        return fwd.resources(cfg, scan_problem(problem), device)
    end,

    source = function(cfg, problem, device)
        if fused(problem) then
            local consts = spec.scan_consts(scan_problem(problem)) -- 16-bit: spec.ELEM names them
            consts.SMEM = dkdv_smem(cfg, problem)
            return { template = "la_bwd_sm90/dkdv.cu", consts = consts }
        end
        local src = fwd.source(cfg, scan_problem(problem), device)
        src.consts.REVERSE = problem.part ~= 0 and "true" or "false"
        src.consts.GRAD_STATE = problem.part ~= 0 and "true" or "false"
        return src
    end,
}
