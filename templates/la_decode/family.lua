-- family.lua — la_decode: T (1..8) single-token steps of Lightning Attention per row, the fp32
-- state updated in place (decode.cu says how the kernel works; docs/notes/la_decode.md has the
-- measurements behind every choice below).
--
-- A tile is TILE_V columns of E by all D rows of one (row, head) state; one CTA per tile, grid
-- {E / TILE_V, H, B}. The state slice of a thread lives in registers for all T steps. A state
-- stored in 16 bits (problem.state_dtype) keeps 16-byte accesses: a vector holds 8 elements
-- instead of 4, so a row needs half the threads and each thread holds 8 columns per vector.

local spec = import("common/spec.lua")
local ELEM, pow2ceil, log2_bucket = spec.ELEM, spec.pow2ceil, spec.log2_bucket

-- Geometry of a config: computed here once and handed to decode.cu as constants (LPR, RS, NR,
-- NSLOT, SMEM), which the kernel checks with static_asserts instead of recomputing.
-- State elements per 16-byte vector: 4 floats or 8 16-bit values.
local function vec_elems(problem)
    return 16 // spec.ESIZE[spec.state_dtype(problem)]
end

-- Measured by the compile sweep: this one tile shape spills 8 bytes on sm_80 since fresh slots
-- added a predicate to the state loads (40 registers; sm_90 and later do not).
local function spills_on_sm80(cfg, problem, device)
    return device.cc < 90 and problem.D == 256 and not problem.vk and cfg.TILE_V == 16
        and cfg.WARPS == 8 and problem.T == 1
end

local function geometry(cfg, problem)
    local nt = cfg.WARPS * 32
    local sv = vec_elems(problem)
    local cw = problem.vk and problem.D or cfg.TILE_V -- contiguous width of the tile
    local rd = problem.vk and cfg.TILE_V or problem.D -- rows of the tile
    local lpr = pow2ceil(cw // sv)
    local rs = nt // lpr
    if rs == 0 then -- a row needs more threads than the CTA has: valid() rejects this first
        return { nt = nt, sv = sv, cw = cw, rd = rd, lpr = lpr, rs = 0, nr = 0, nslot = 0,
                 state_regs = 0, data_regs = 0 }
    end
    local nr = (rd + rs - 1) // rs
    local nslot
    if problem.vk then
        nslot = lpr > 32 and lpr // 32 or 1
    else
        nslot = lpr >= 32 and rs or cfg.WARPS
    end
    -- Registers a thread needs for data (decode.cu's Regs and acc): the state slice, q and k for
    -- its d, v for its e, each for all T steps, and T output partial sums.
    local nq = problem.vk and sv or nr
    local nv = problem.vk and nr or sv
    -- (PACKED holds the state as stored: 4 registers per 16-byte vector.)
    local state_regs = cfg.PACKED == 1 and 4 * nr or sv * nr
    local data_regs = state_regs + problem.T * (2 * nq + 2 * nv)
    return { nt = nt, sv = sv, cw = cw, rd = rd, lpr = lpr, rs = rs, nr = nr, nslot = nslot,
             state_regs = state_regs, data_regs = data_regs }
end

-- Dynamic shared memory: staged q, k, v (DIRECT = 0) and the output reduction buffer.
local function smem(cfg, problem)
    local g = geometry(cfg, problem)
    local stage = cfg.DIRECT == 1 and 0 or problem.T * (2 * problem.D + cfg.TILE_V)
    return 4 * (stage + problem.T * g.nslot * cfg.TILE_V)
end

return {
    name = "la_decode",
    op = "decode",

    params = {
        TILE_V = { 8, 16, 32, 64, 128, 256 }, -- E columns per CTA: small = more CTAs for small batches
        WARPS = { 1, 2, 4, 8, 16 },           -- with TILE_V, the state registers per thread
        DIRECT = { 0, 1 },  -- 1: q, k, v loaded straight into registers (best at T = 1);
                            -- 0: staged once per CTA in shared memory (best at T > 1)
        CACHE = { 0, 1, 2, 3 }, -- state access hint: 0 none, 1 .cs, 2 L2 evict-first, 3 L2 256B
        PACKED = { 0, 1 },  -- 1 (KV, T = 1, a 16-bit state): vectors widened at their row's turn
    },

    problems = {
        { op = "decode", dtype = "bf16", B = 64, H = 64, N = 1, D = 128, E = 128, T = 1,
          decay = true, vk = false, step_states = false },
        { op = "decode", dtype = "f32", B = 8, H = 16, N = 4, D = 64, E = 128, T = 4,
          decay = true, vk = true, step_states = true },
        { op = "decode", dtype = "f16", B = 1, H = 32, N = 1, D = 256, E = 256, T = 1,
          decay = true, vk = false, step_states = false },
        { op = "decode", dtype = "bf16", B = 3, H = 8, N = 8, D = 96, E = 48, T = 8,
          decay = false, vk = true, step_states = true },
        -- 16-bit pools and a mixed output (issue 23): fp32 inputs, a bf16 o, a bf16 pool.
        { op = "decode", dtype = "f32", B = 64, H = 64, N = 1, D = 128, E = 128, T = 1,
          decay = true, vk = false, step_states = false, state_dtype = "bf16", out_dtype = "bf16" },
        { op = "decode", dtype = "bf16", B = 8, H = 16, N = 4, D = 64, E = 128, T = 4,
          decay = true, vk = true, step_states = true, state_dtype = "f16" },
    },

    valid = function(cfg, problem, device)
        local ok, why = spec.check_dtype(problem)
        if ok then ok, why = spec.check_io_dtypes(problem) end
        if ok then ok, why = spec.check_dims(problem) end
        if not ok then return false, why end
        if problem.T < 1 or problem.T > 8 then return false, "T must be 1..8" end
        ok, why = spec.check_tile(cfg.TILE_V, problem.E)
        if not ok then return false, why end
        local g = geometry(cfg, problem)
        if g.lpr > g.nt then
            return false, string.format("a row of %d state elements needs %d threads, the CTA has %d",
                                        g.cw, g.lpr, g.nt)
        end
        if cfg.PACKED == 1 and (problem.vk or problem.T ~= 1 or g.sv ~= 8) then
            return false, "PACKED=1 needs the KV layout, T = 1 and a 16-bit state"
        end
        if g.nr * g.sv > 128 then
            return false, string.format("%d state floats per thread (over 128 registers)", g.nr * g.sv)
        end
        if spills_on_sm80(cfg, problem, device) then
            return false, "D = 256, TILE_V = 16 with 8 warps spills on sm_80"
        end
        if g.data_regs > 160 then -- measured: 256 data registers spill ~900 bytes
            return false, string.format("%d data registers per thread (state, q, k, v, sums; limit 160)",
                                        g.data_regs)
        end
        if (g.nr * g.rs - g.rd) * 2 > g.nr * g.rs then
            return false, string.format("%d of %d thread rows would hold no state",
                                        g.nr * g.rs - g.rd, g.nr * g.rs)
        end
        ok, why = spec.check_smem(smem(cfg, problem), device)
        if not ok then return false, why end
        if cfg.CACHE >= 2 and device.cc < 80 then
            return false, "CACHE=2,3 need sm_80 or newer"
        end
        return true
    end,

    -- Measured on an H200 (132 SMs), H = 64, D = E = 128, bf16 inputs, cold L2, as a CUDA graph of
    -- back-to-back steps (`lajit tune`'s graph timing; docs/notes/la_decode.md, session 11): the
    -- fp32 pool wants about a thousand CTAs at small batches — 16-column tiles (8 CTAs per state)
    -- for fewer states than SMs, staged q, k, v and the L2 evict-first hint from one state per SM
    -- to four, then 64-column tiles of 16 warps; a 16-bit pool (8 values per 16-byte vector)
    -- wants the same bytes per row: 32-column tiles of 4 warps at small batches, 128-column tiles
    -- of 16 warps from two states per SM on (but one-warp tiles of 16 rows per thread at about
    -- four), with the streaming hint; the small batches' tiles keep the stored vectors packed
    -- until used (PACKED: 2.73 -> 2.62 us at B = 1, session 22; 0.2-0.6 % slower with the
    -- 128-column tiles, which do without). VK tiles are contiguous, so
    -- narrow tiles cost less there (a 16-bit VK pool: at least 32 rows per tile). T > 1 stages q, k, v in shared memory (direct loads of T rows
    -- of q and k per thread are slow) except for fewer states than SMs. The thresholds compare
    -- log2 buckets, the same buckets as key(), so one bucket always gets one config.
    default = function(problem, device)
        local lb = log2_bucket(problem.B * problem.H)
        local ls = log2_bucket(device.sms) -- 7 for 132 SMs
        local wide = vec_elems(problem) == 8 -- a 16-bit state: twice the values per vector
        local cfg
        if problem.T > 1 then
            if lb < ls then
                cfg = wide and { TILE_V = 32, WARPS = 4, DIRECT = 0, CACHE = 1 }
                    or { TILE_V = 16, WARPS = 8, DIRECT = 1, CACHE = 0 }
            else
                cfg = { TILE_V = 32, WARPS = 4, DIRECT = 0, CACHE = 0 }
            end
        elseif problem.vk then
            if lb < ls + 2 then
                cfg = { TILE_V = 64, WARPS = 8, DIRECT = 1, CACHE = 0 }
            elseif lb < ls + 6 then
                cfg = { TILE_V = 16, WARPS = 8, DIRECT = 1, CACHE = 0 }
            else
                cfg = { TILE_V = 128, WARPS = 16, DIRECT = 1, CACHE = 0 }
            end
            -- A VK tile's rows are whole D-wide rows, so a 16-bit pool moves half the bytes
            -- per row at the same TILE_V: 32 rows instead of 16 in the middle range, and no
            -- doubling below one state per SM (that left 64 CTAs at B = 1: 39 % of the ceiling;
            -- 89 % with this rule, docs/notes/la_decode.md, session 11).
            if wide and cfg.TILE_V == 16 then cfg.TILE_V = 32 end
        elseif wide then
            if lb <= ls then
                cfg = { TILE_V = 32, WARPS = 4, DIRECT = 1, CACHE = 1, PACKED = 1 }
            elseif lb == ls + 2 then
                -- About four states per SM: one-warp CTAs of 16 packed rows per thread put the
                -- whole step's state in flight in one wave (B = 8: 10.2 -> 9.4 us, session 22).
                cfg = { TILE_V = 32, WARPS = 1, DIRECT = 1, CACHE = 3, PACKED = 1 }
            else
                cfg = { TILE_V = 128, WARPS = 16, DIRECT = 1, CACHE = lb <= ls + 6 and 1 or 0 }
            end
        else
            if lb < ls then
                cfg = { TILE_V = 16, WARPS = 4, DIRECT = 1, CACHE = 3 }
            elseif lb == ls then
                cfg = { TILE_V = 16, WARPS = 8, DIRECT = 0, CACHE = 2 }
            elseif lb == ls + 1 then
                cfg = { TILE_V = 32, WARPS = 4, DIRECT = 0, CACHE = 2 }
            elseif lb == ls + 2 then
                cfg = { TILE_V = 64, WARPS = 8, DIRECT = 0, CACHE = 2 }
            elseif lb == ls + 3 then
                cfg = { TILE_V = 64, WARPS = 16, DIRECT = 1, CACHE = 1 }
            else
                cfg = { TILE_V = 64, WARPS = 16, DIRECT = 1, CACHE = 0 }
            end
        end
        if device.cc < 80 then cfg.CACHE = 0 end
        cfg.PACKED = cfg.PACKED or 0
        -- Other shapes: the widest tile that divides E, then warps so that every thread holds
        -- state (at most 64 registers of it) and a row fits in the CTA.
        while problem.E % cfg.TILE_V ~= 0 or cfg.TILE_V > problem.E do cfg.TILE_V = cfg.TILE_V // 2 end
        local g = geometry(cfg, problem)
        while g.state_regs > 64 and cfg.WARPS < 16 do
            cfg.WARPS = cfg.WARPS * 2
            g = geometry(cfg, problem)
        end
        while (g.lpr > g.nt or g.nr * g.sv > 128 or g.data_regs > 128) and cfg.WARPS < 16 do
            cfg.WARPS = cfg.WARPS * 2
            g = geometry(cfg, problem)
        end
        while cfg.WARPS > 1 and g.rs > g.rd and g.lpr <= g.nt // 2 do
            cfg.WARPS = cfg.WARPS // 2
            g = geometry(cfg, problem)
        end
        if spills_on_sm80(cfg, problem, device) then cfg.WARPS = 16 end
        return cfg
    end,

    key = function(problem)
        return string.format("%s_D%d_E%d_T%d_%s_%s%s%s_bh%d", problem.dtype, problem.D, problem.E,
                             problem.T, problem.decay and "decay" or "nodecay",
                             problem.vk and "vk" or "kv", problem.step_states and "_steps" or "",
                             spec.dtype_suffix(problem), log2_bucket(problem.B * problem.H))
    end,

    launch = function(cfg, problem, device)
        return {
            grid = { problem.E // cfg.TILE_V, "H", "B" },
            block = { cfg.WARPS * 32, 1, 1 },
            smem = smem(cfg, problem),
            entry = "la_decode",
            -- The kernel waits (common/pdl.cuh) before any global access, so on sm_90 and later
            -- its CTAs may start while the previous kernel on the stream finishes. Measured on
            -- the H200 (docs/notes/la_decode.md, session 11): T = 1 gains up to 10 % at small
            -- batches (B = 1: 3.51 -> 3.27 us fp32 pool, 2.70 -> 2.42 bf16) and loses nothing
            -- beyond; T = 4 loses up to 17 % at small batches (waiting CTAs crowd the SMs
            -- that a longer step needs), so only single steps ask for it. Not the one-warp packed
            -- tiles either (the default at about four states per SM, one wave of long CTAs): bf16
            -- pool B = 8 ran 9.50 us without, 10.20 with (session 22) — the next step's CTAs,
            -- resident early where slots free first, leave its single wave unevenly spread.
            pdl = device.cc >= 90 and problem.T == 1 and not (cfg.PACKED == 1 and cfg.WARPS == 1),
        }
    end,

    -- What a compile may use (the compile sweep checks it): the launch bounds' registers, and
    -- the dynamic shared memory launch() asks for (no static).
    resources = function(cfg, problem, device)
        return { regs = spec.reg_cap(device, cfg.WARPS * 32, 1), smem = smem(cfg, problem) }
    end,

    source = function(cfg, problem, device)
        local g = geometry(cfg, problem)
        return {
            template = "la_decode/decode.cu",
            consts = {
                ELEM = ELEM[problem.dtype],
                OUT_ELEM = ELEM[spec.out_dtype(problem)],
                STATE_T = ELEM[spec.state_dtype(problem)],
                D = problem.D,
                E = problem.E,
                T = problem.T,
                VK = spec.b(problem.vk),
                DECAY = spec.b(problem.decay),
                STEP_STATES = spec.b(problem.step_states),
                PACKED = spec.b(cfg.PACKED == 1),
                LPR = g.lpr,
                RS = g.rs,
                NR = g.nr,
                NSLOT = g.nslot,
                SMEM = smem(cfg, problem),
            },
        }
    end,
}
