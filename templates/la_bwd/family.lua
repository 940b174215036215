-- family.lua — la_bwd: the chunked Lightning Attention backward (DESIGN.md, "Backward").
--
-- The op runs up to four kernels, one per `part` of the problem (0..3), each with its own plan
-- and tuning bucket:
--   0 dq  the scan of la_fwd/fwd.cu over (dO, v, k) with the transposed state Sᵀ and S₀ᵀ:
--         dq_t = σ dO_t S_tᵀ is a forward whose "q" is dO, "k" is v and "v" is k.
--   1 dv  the scan walked from the last token over (k, q, dO) with the state G/σ: dv_t = k_t G_t;
--         its final state, scaled by σλ, is dS₀; its initial state is dS_N.
--   2 dk  the same reversed scan over (v, dO, q) with (G/σ)ᵀ: dk_t = v_t G_tᵀ.
--   3 ds  la_bwd/ds.cu: the decay gradient, only when requested (fp32 recurrence, see there).
-- Nothing is stored between the parts: each recomputes what it needs from q, k, v and dO, so the
-- memory a training step needs beyond its inputs is dq, dk, dv (and a few bytes for ds).

local spec = import("common/spec.lua")
local scan = import("common/scan.lua")
local ELEM, log2_bucket = spec.ELEM, spec.log2_bucket

local PARTS = { [0] = "dq", [1] = "dv", [2] = "dk", [3] = "ds" }

-- The scan's own shape for parts 0..2 (what la_fwd/fwd.cu calls D and E).
local function scan_problem(problem)
    local sp = {}
    for k, v in pairs(problem) do sp[k] = v end
    if problem.part == 0 or problem.part == 2 then
        sp.D, sp.E = problem.E, problem.D
    end
    return sp
end

-- ---- ds (part 3): CTAs of WARPS·32 threads over (TILE_V columns, head, sequence); a thread holds
-- an RD × 4 block of the D × TILE_V slice of S and of Y (RD rows, 4 columns); BLOCK tokens of
-- q, k, v, dO are staged in shared memory as fp32.
local function ds_geometry(cfg, problem)
    local nt = cfg.WARPS * 32
    local cg = cfg.TILE_V // 4
    if nt % cg ~= 0 then return nil, "threads do not cover the column groups" end
    local rg = nt // cg
    if problem.D % rg ~= 0 then
        return nil, string.format("%d row groups do not divide D=%d", rg, problem.D)
    end
    local rd = problem.D // rg
    if rd > 8 then return nil, string.format("%d rows per thread (at most 8)", rd) end
    return { rd = rd, cg = cg, rg = rg }
end

local function ds_smem(cfg, problem)
    return cfg.BLOCK * (2 * problem.D + 2 * cfg.TILE_V) * 4
end

local function ds_valid(cfg, problem, device)
    if not problem.decay then return false, "ds needs the decay path" end
    local ok, why = spec.check_tile(cfg.TILE_V, problem.E)
    if not ok then return false, why end
    if cfg.STAGES ~= 2 or cfg.MINB ~= 1 then
        return false, "ds does not pipeline (STAGES=2, MINB=1 only)"
    end
    local g, why = ds_geometry(cfg, problem)
    if not g then return false, why end
    -- Measured by the compile sweep: 8 rows per thread in 2-warp CTAs spill 12 bytes on sm_120
    -- since the shares' reduction became common/ds_share.cuh (a run-time slice count).
    if device.cc >= 120 and cfg.WARPS == 2 and g.rd == 8 then
        return false, "8 rows per thread with 2 warps spill on sm_120"
    end
    return spec.check_smem(ds_smem(cfg, problem), device)
end

local function ds_default(problem, device)
    for _, tv in ipairs({ 32, 16, 64, 128 }) do
        for _, w in ipairs({ 8, 4, 2 }) do
            local cfg = { BLOCK = 32, TILE_V = tv, WARPS = w, STAGES = 2, MINB = 1 }
            if ds_valid(cfg, problem, device) then return cfg end
        end
    end
    return { BLOCK = 32, TILE_V = 16, WARPS = 2, STAGES = 2, MINB = 1 }
end

local function check_common(problem)
    local ok, why = spec.check_dtype(problem)
    if ok then ok, why = spec.check_dims(problem) end
    if not ok then return false, why end
    if PARTS[problem.part] == nil then return false, "part must be 0 (dq), 1 (dv), 2 (dk) or 3 (ds)" end
    return true
end

return {
    name = "la_bwd",
    op = "bwd",
    uses = { "la_fwd" },                 -- its scans are la_fwd/fwd.cu

    -- The passes the op runs, in order, and what each hands its kernel (runtime/roles.c applies
    -- this; nothing about the parts is wired in C). q, k, v, o, s0 (initial state read) and sn
    -- (final state written) are the scan's arguments, each given one of the op's tensors: q, k,
    -- v, dout, dq, dk, dv, s0 (S₀), dsn (dS_N), ds0 (dS₀). transpose: states read as [E, D];
    -- swap_de: the scan's D and E are the op's E and D; flags: the problem flags the kernel
    -- depends on (the others are cleared, so identical kernels share a plan and a bucket);
    -- when: flags the call must have for the pass to run; all: the kernel takes every tensor as
    -- the op received it; ticket: the workspace's ticket counter is zeroed first when the pass
    -- wants ds; ds: the kernel keeps the op's ds output and workspace. The dq pass also hands
    -- on q (as x) and dS_N: a family whose dq kernel computes ds beside dq (la_bwd_sm90) says so
    -- by its launch's `covers = { 3 }`, and the op then skips part 3; this family's dq kernel
    -- ignores them. Likewise the dv pass hands on v (as x) and dk (as o2, a second output): a
    -- kernel that computes dk beside dv (la_bwd_sm90/dkdv.cu) says `covers = { 2 }`.
    roles = {
        { part = 0, q = "dout", k = "v", v = "k", o = "dq", s0 = "s0", x = "q", dsn = "dsn",
          transpose = { "s0", "dsn" }, swap_de = true, ds = true, ticket = true,
          flags = { "has_initial", "has_dsn", "want_ds" } },            -- dq = σ dO Sᵀ (and ds)
        { part = 1, q = "k", k = "q", v = "dout", o = "dv", s0 = "dsn", sn = "ds0", x = "v",
          o2 = "dk", flags = { "has_final", "has_dsn" } },              -- dv, reversed, dS₀
        { part = 2, q = "v", k = "dout", v = "q", o = "dk", s0 = "dsn", transpose = { "s0" },
          swap_de = true, flags = { "has_dsn" } },                      -- dk, reversed
        { part = 3, all = true, ticket = true, when = { "want_ds" },
          flags = { "has_initial", "has_dsn", "want_ds" } },            -- ds (ds.cu)
    },

    -- The scan's space (la_fwd's, trimmed the same way for the CPU compile sweep); ds uses
    -- BLOCK (tokens staged), TILE_V (columns per CTA) and WARPS.
    params = {
        BLOCK = { 16, 32, 64 },
        TILE_V = { 16, 32, 64, 128 },
        WARPS = { 2, 4, 8 },
        STAGES = { 2 },
        MINB = { 1 },
    },

    -- has_initial: S₀ given; has_final: dS₀ wanted; has_dsn: dS_N given; want_ds: ds wanted.
    problems = {
        { op = "bwd", part = 0, dtype = "bf16", B = 4, H = 32, N = 8192, D = 128, E = 128,
          decay = true },
        { op = "bwd", part = 1, dtype = "bf16", B = 4, H = 32, N = 8192, D = 64, E = 64,
          decay = true, has_initial = true, has_final = true, has_dsn = true },
        { op = "bwd", part = 2, dtype = "f16", B = 2, H = 8, N = 2048, D = 96, E = 64,
          decay = false, has_dsn = true, varlen = true, vk = true },
        { op = "bwd", part = 3, dtype = "f32", B = 2, H = 8, N = 2048, D = 128, E = 64,
          decay = true, has_initial = true, has_dsn = true, want_ds = true },
        { op = "bwd", part = 1, dtype = "f32", B = 2, H = 8, N = 4096, D = 64, E = 128,
          decay = true, has_final = true, has_dsn = true, state_only = true },
    },

    valid = function(cfg, problem, device)
        local ok, why = check_common(problem)
        if not ok then return false, why end
        -- state_only: lajit_attn_bwd with dq, dk and dv NULL runs the dv pass alone, for dS₀.
        if problem.state_only and (problem.part ~= 1 or not problem.has_final) then
            return false, "state_only is the dv pass writing dS0 alone"
        end
        if problem.part == 3 then return ds_valid(cfg, problem, device) end
        return scan.valid(cfg, scan_problem(problem), device)
    end,

    -- dq, dv and dk are forwards of the same shapes, so they take the forward's measured
    -- heuristic (common/scan.lua); ds takes 8 warps of 4 × 4 blocks where they fit.
    default = function(problem, device)
        if problem.part == 3 then return ds_default(problem, device) end
        return scan.default(scan_problem(problem), device)
    end,

    -- (dq's kernel here does not read dS_N nor compute ds, so part 0's bucket ignores both.)
    key = function(problem)
        local dsn = problem.has_dsn and problem.part ~= 0
        return string.format("%s_%s_D%d_E%d_%s%s%s%s%s%s_n%d_bh%d", PARTS[problem.part] or "?",
                             problem.dtype, problem.D, problem.E,
                             problem.decay and "decay" or "nodecay",
                             problem.has_initial and "_s0" or "",
                             problem.has_final and (problem.state_only and "_ds0only" or "_ds0") or "",
                             dsn and "_dsn" or "", problem.varlen and "_varlen" or "",
                             problem.vk and "_vk" or "", log2_bucket(math.max(problem.N, 1)),
                             log2_bucket(problem.B * problem.H))
    end,

    launch = function(cfg, problem, device)
        local seqs = problem.varlen and "nseq" or "B"
        if problem.part == 3 then
            return {
                grid = { problem.E // cfg.TILE_V, "H", seqs },
                block = { cfg.WARPS * 32, 1, 1 },
                smem = ds_smem(cfg, problem),
                entry = "la_bwd_ds",
            }
        end
        local sp = scan_problem(problem)
        return {
            grid = { sp.E // cfg.TILE_V, "H", seqs },
            block = { cfg.WARPS * 32, 1, 1 },
            smem = scan.smem(cfg, sp),
            entry = "la_fwd",
        }
    end,

    source = function(cfg, problem, device)
        local b = spec.b
        if problem.part == 3 then
            local g = ds_geometry(cfg, problem)
            return {
                template = "la_bwd/ds.cu",
                consts = {
                    ELEM = ELEM[problem.dtype],
                    D = problem.D,
                    E = problem.E,
                    RD = g.rd,
                    SMEM = ds_smem(cfg, problem),
                    HAS_INITIAL = b(problem.has_initial),
                    HAS_DSN = b(problem.has_dsn),
                    VARLEN = b(problem.varlen),
                },
            }
        end
        local sp = scan_problem(problem)
        local part = problem.part
        return {
            template = "la_fwd/fwd.cu",
            consts = scan.geometry_consts(cfg, sp, {
                ELEM = ELEM[problem.dtype],
                D = sp.D,
                E = sp.E,
                DECAY = b(problem.decay),
                -- dq starts from S₀; dv and dk from dS_N; only dv writes a state (dS₀).
                HAS_INITIAL = b(part == 0 and problem.has_initial or part ~= 0 and problem.has_dsn),
                HAS_FINAL = b(part == 1 and problem.has_final),
                VARLEN = b(problem.varlen),
                REVERSE = b(part ~= 0),
                GRAD_STATE = b(part ~= 0),
                STATE_ONLY = b(problem.state_only), -- the dv pass for dS₀ alone
            }),
        }
    end,

    -- What a compile may use (checked by the compile sweep): the scan's claim, or for ds its
    -- launch bounds and dynamic shared memory plus the static reduction slots (NT / 32 floats and
    -- a flag).
    resources = function(cfg, problem, device)
        if problem.part == 3 then
            return { regs = spec.reg_cap(device, cfg.WARPS * 32, 1),
                     smem = ds_smem(cfg, problem) + 4 * cfg.WARPS + 32 }
        end
        return scan.resources(cfg, scan_problem(problem), device)
    end,
}
