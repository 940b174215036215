-- family.lua — la_state_pool: copies between a pool of states and a batch of them, addressed by
-- slot indices in the encoding of the ops' state_slots (include/lajit.h, LAJIT_SLOT_*). Context
-- parallelism over varlen batches whose sequences cross ranks moves a sequence's state between
-- its pool slot and the compact [n, H, R, C] batch the exchange and the scan work on:
--
--   gather  (scatter = 0):  states[i] = pool[s]  when slots[i] = s >= 0;
--                           states[i] = 0        when slots[i] is −1 or LAJIT_SLOT_FRESH(s)
--                                                (a fresh slot is never read)
--   scatter (scatter = 1):  pool[s] = states[i]  when slots[i] = s >= 0 or LAJIT_SLOT_FRESH(s);
--                           nothing written      when slots[i] is −1
--
-- The copy is elementwise over a state's [R, C] elements, so it does not care which of the last
-- two dimensions is D (R and C are the rows and columns as stored, D and E or E and D, baked into
-- the kernel); P (the pool's slots), H and N (the batch's states) are read at run time. A slot
-- outside [0, P) is the caller's error (runtime/pool_op.c refuses it in checked mode); the kernel
-- treats one as −1 rather than touch memory outside the pool. The internal entries
-- lj_state_pool_gather and lj_state_pool_scatter (runtime/pool_op.c) check a call in their own
-- terms and launch this family through lajit_launch; pool.cu says how the kernel walks.

local spec = import("common/spec.lua")
local log2_bucket = spec.log2_bucket

-- Floats per vector access: 4 (16 bytes) when a row holds whole vectors; the declaration's 16-byte
-- alignment of addresses and strides makes every vector of a row aligned.
local function vec(problem)
    if problem.C % 4 == 0 then return 4 end
    if problem.C % 2 == 0 then return 2 end
    return 1
end

-- Vector accesses per state (one thread each).
local function items(problem)
    return problem.R * problem.C // vec(problem)
end

-- CTAs per state: the grid's y dimension (at most 65535), so a state may hold at most
-- 65535 · 64 vectors; no attention state (256 × 256 at most) comes near it.
local MAX_ELEMS = 1 << 22

return {
    name = "la_state_pool",
    op = "custom",
    dtypes = { "f32" },
    dynamic = { "P", "H", "N" },

    -- States are read and written in 16-byte vectors of rows: unit last stride, addresses and
    -- other strides multiples of 16 bytes (the rules of every state argument of the attention
    -- ops). Both state tensors are outputs (the pool of a scatter, the batch of a gather), so the
    -- launch refuses them sharing an element. Slots: one int32 per state, any stride.
    args = {
        { name = "pool", dtype = "f32", shape = { "P", "H", "R", "C" }, output = true,
          unit_stride = true, align = 16 },
        { name = "slots", dtype = "i32", shape = { "N" } },
        { name = "states", dtype = "f32", shape = { "N", "H", "R", "C" }, output = true,
          unit_stride = true, align = 16 },
        { name = "scatter", scalar = "i32" }, -- 0: pool -> states (gather); else states -> pool
        -- A fresh slot: -1 the direction's rule (a gather skips it, a scatter writes it),
        -- 0 none either way, 1 its slot either way.
        { name = "fresh_mode", scalar = "i32" },
    },

    params = {
        THREADS = { 64, 128, 256, 512 }, -- threads per CTA, one vector of a state each
    },

    problems = {
        -- A varlen batch of 16 sequences' states, D = E = 128, out of a pool of 64.
        { op = "custom", dtype = "f32", P = 64, H = 8, R = 128, C = 128, N = 16 },
        -- D = 64, E = 32, a few states.
        { op = "custom", dtype = "f32", P = 5, H = 3, R = 64, C = 32, N = 3 },
        -- A narrow odd width (scalar accesses).
        { op = "custom", dtype = "f32", P = 7, H = 2, R = 16, C = 6, N = 9 },
    },

    valid = function(cfg, problem, device)
        if problem.dtype ~= "f32" then return false, "states are float32" end
        if problem.R * problem.C > MAX_ELEMS then
            return false, string.format("a state of %d x %d elements (at most %d)", problem.R,
                                        problem.C, MAX_ELEMS)
        end
        -- A CTA wider than the state would leave threads idle: the next smaller one serves.
        if cfg.THREADS > 64 and cfg.THREADS > items(problem) then
            return false, string.format("%d threads for %d vectors of a state", cfg.THREADS,
                                        items(problem))
        end
        return true
    end,

    -- Not measured (a copy, bandwidth-bound and tiny beside the attention passes): 256 threads of
    -- 16-byte vectors; narrower CTAs for small states.
    default = function(problem, device)
        local t = 256
        while t > 64 and t > items(problem) do t = t // 2 end
        return { THREADS = t }
    end,

    key = function(problem)
        return string.format("R%d_C%d_p%d_n%d_h%d", problem.R, problem.C, log2_bucket(problem.P),
                             log2_bucket(problem.N), log2_bucket(problem.H))
    end,

    -- x over the batch's states (N may pass 65535, a server's batch; x reaches 2^31 − 1), y over
    -- the vectors of a state, z over heads.
    launch = function(cfg, problem, device)
        return {
            grid = { "N", (items(problem) + cfg.THREADS - 1) // cfg.THREADS, "H" },
            block = { cfg.THREADS, 1, 1 },
            smem = 0,
            entry = "la_state_pool",
        }
    end,

    -- What a compile may use (the compile sweep checks it): the launch bounds' registers, no
    -- shared memory.
    resources = function(cfg, problem, device)
        return { regs = spec.reg_cap(device, cfg.THREADS, 1), smem = 0 }
    end,

    source = function(cfg, problem, device)
        return {
            template = "la_state_pool/pool.cu",
            consts = {
                VEC = vec(problem),
                ITEMS = items(problem),
            },
        }
    end,
}
