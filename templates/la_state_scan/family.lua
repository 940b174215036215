-- family.lua — la_state_scan: the scan over a sequence's spans that context parallelism (a
-- sequence split across GPUs, or across CTAs of one GPU) exchanges. Each span j of n_j tokens has
-- a local state M_j (its final state from a zero start); the scan turns them into the state
-- entering every span, and its reverse does the same for the backward's gradient states:
--
--   forward:  X_0 = S_0 (or 0);        out_j = X_j;   X_{j+1} = λ^{n_j} X_j + M_j   (j = 0..P−1)
--   reverse:  X_{P−1} = dS_N (or 0);   out_j = X_j;   X_{j−1} = λ^{n_j} X_j + M_j   (j = P−1..0)
--
-- and `final_state` receives the carry after the walk (S_N, or dS_0 in reverse). λ = exp(−s_h)
-- (1 without s). A length n_j = −1 marks a span that starts a new sequence (varlen batches whose
-- sequences cross spans): the carry does not pass through it, X ← M_j (λ^{n_j} taken as 0, with
-- or without decay), and a lengths row holding one has total_lengths64 −1. include/lajit.h (lajit_attn_state_scan) states what each quantity means in
-- DESIGN.md's terms; scan.cu says how the kernel walks.
--
-- It is elementwise over a state's [D, E] elements, so the kernel does not care which of the last
-- two dimensions is D: the declared symbols are R and C, the rows and columns of the states as
-- stored (D and E, or E and D with LAJIT_STATE_VK), baked into the kernel; P, B, H and LB (the
-- lengths' second dimension: 1 for [P] lengths, B for per-row ones) are read at run time. Exactly
-- one of lengths (int32) and lengths64 (int64) is given, and read with or without s (−1 resets).
-- total_lengths64 (optional) receives each lengths row's Σ_j n_j (−1 when one n_j is −1). The typed entry lajit_attn_state_scan
-- (runtime/scan_op.c) checks the call in the op's own terms and launches this family through
-- lajit_launch; the family may also be launched by name like any op "custom" family.

local spec = import("common/spec.lua")
local log2_bucket = spec.log2_bucket

-- Floats per vector access: 4 (16 bytes) when a row holds whole vectors; the declaration's 16-byte
-- alignment of addresses and strides makes every vector of a row aligned.
local function vec(problem)
    if problem.C % 4 == 0 then return 4 end
    if problem.C % 2 == 0 then return 2 end
    return 1
end

-- Vector accesses per state (one thread each, per span).
local function items(problem)
    return problem.R * problem.C // vec(problem)
end

-- The largest state the grid's x dimension and the offsets of one (b, h) comfortably cover: no
-- attention state comes near it.
local MAX_ELEMS = 1 << 26

return {
    name = "la_state_scan",
    op = "custom",
    dtypes = { "f32" },
    dynamic = { "P", "B", "H", "LB" },

    -- The states are read and written in 16-byte vectors of rows: unit last stride, addresses and
    -- other strides multiples of 16 bytes (as every state argument of the attention ops). Lengths
    -- are read one integer per span with any strides ([B, P] memory passes as a [P, B] view).
    args = {
        { name = "local_states", dtype = "f32", shape = { "P", "B", "H", "R", "C" },
          unit_stride = true, align = 16 },
        { name = "lengths", dtype = "i32", shape = { "P", "LB" }, optional = true },
        { name = "lengths64", dtype = "i64", shape = { "P", "LB" }, optional = true },
        { name = "s", dtype = "f32", shape = { "H" }, optional = true, unit_stride = true,
          fill = { 0.05, 0.5 } },
        { name = "initial_state", dtype = "f32", shape = { "B", "H", "R", "C" }, optional = true,
          unit_stride = true, align = 16 },
        { name = "incoming_states", dtype = "f32", shape = { "P", "B", "H", "R", "C" },
          output = true, unit_stride = true, align = 16 },
        { name = "final_state", dtype = "f32", shape = { "B", "H", "R", "C" }, optional = true,
          output = true, unit_stride = true, align = 16 },
        -- Σ_j n_j per lengths row (the log2(P)-step exchange's combined length); −1 when a span
        -- of the row starts a new sequence (n_j = −1).
        { name = "total_lengths64", dtype = "i64", shape = { "LB" }, optional = true,
          output = true },
        { name = "reverse", scalar = "i32" }, -- 0: walk spans first to last; else last to first
    },

    params = {
        THREADS = { 64, 128, 256, 512 }, -- threads per CTA, one vector of the state each
        UNROLL = { 1, 2, 4, 8 },         -- spans whose loads are issued before the first is used
    },

    problems = {
        -- Context parallelism over 8 GPUs, D = E = 128, one length per span.
        { op = "custom", dtype = "f32", P = 8, B = 1, H = 64, R = 128, C = 128, LB = 1,
          has_lengths = true, has_lengths64 = false, has_s = true, has_initial_state = false,
          has_final_state = true, has_total_lengths64 = false },
        -- Per-row int64 lengths, an initial state, no decay.
        { op = "custom", dtype = "f32", P = 3, B = 2, H = 3, R = 64, C = 32, LB = 2,
          has_lengths = false, has_lengths64 = true, has_s = false, has_initial_state = true,
          has_final_state = true, has_total_lengths64 = false },
        -- One combine of the log2(P)-step exchange: two spans, int64 lengths, their total.
        { op = "custom", dtype = "f32", P = 2, B = 1, H = 8, R = 128, C = 128, LB = 1,
          has_lengths = false, has_lengths64 = true, has_s = true, has_initial_state = false,
          has_final_state = true, has_total_lengths64 = true },
        -- A narrow odd width (scalar accesses), many spans.
        { op = "custom", dtype = "f32", P = 17, B = 2, H = 3, R = 16, C = 6, LB = 1,
          has_lengths = true, has_lengths64 = false, has_s = true, has_initial_state = true,
          has_final_state = false, has_total_lengths64 = false },
    },

    valid = function(cfg, problem, device)
        if problem.dtype ~= "f32" then return false, "states are float32" end
        if problem.has_lengths == problem.has_lengths64 then
            return false, "exactly one of lengths (int32) and lengths64 (int64) must be given"
        end
        if problem.R * problem.C > MAX_ELEMS then
            return false, string.format("a state of %d x %d elements (at most %d)", problem.R,
                                        problem.C, MAX_ELEMS)
        end
        -- A CTA wider than the state would leave threads idle: the next smaller one serves.
        if cfg.THREADS > 64 and cfg.THREADS > items(problem) then
            return false, string.format("%d threads for %d vectors of a state", cfg.THREADS,
                                        items(problem))
        end
        -- Measured by the compile sweep since the lengths are read with every span (the
        -- segments' resets): eight spans in flight spill 8 bytes on sm_100a at 64 and 128
        -- threads.
        if cfg.UNROLL == 8 and device.cc >= 100 and cfg.THREADS <= 128 then
            return false, "8 spans in flight spill on sm_100a and later at <= 128 threads"
        end
        return true
    end,

    -- Not measured yet (a bandwidth-bound walk, tiny beside the attention passes): 256 threads of
    -- 16-byte vectors, four spans' loads in flight per thread; narrower CTAs for small states.
    default = function(problem, device)
        local t = 256
        while t > 64 and t > items(problem) do t = t // 2 end
        return { THREADS = t, UNROLL = 4 }
    end,

    key = function(problem)
        return string.format("R%d_C%d%s%s%s%s%s_p%d_bh%d", problem.R, problem.C,
                             problem.has_s and "_decay" or "_nodecay",
                             problem.has_lengths64 and "_l64" or (problem.has_lengths and "_l32" or "_l0"),
                             problem.has_initial_state and "_s0" or "",
                             problem.has_final_state and "_sn" or "",
                             problem.has_total_lengths64 and "_total" or "",
                             log2_bucket(problem.P), log2_bucket(problem.B * problem.H))
    end,

    launch = function(cfg, problem, device)
        return {
            grid = { (items(problem) + cfg.THREADS - 1) // cfg.THREADS, "H", "B" },
            block = { cfg.THREADS, 1, 1 },
            smem = 0,
            entry = "la_state_scan",
        }
    end,

    -- What a compile may use (the compile sweep checks it): the launch bounds' registers, no
    -- shared memory.
    resources = function(cfg, problem, device)
        return { regs = spec.reg_cap(device, cfg.THREADS, 1), smem = 0 }
    end,

    source = function(cfg, problem, device)
        return {
            template = "la_state_scan/scan.cu",
            consts = {
                VEC = vec(problem),
                ITEMS = items(problem),
                HAS_S = spec.b(problem.has_s),
                LEN64 = spec.b(problem.has_lengths64),
                HAS_INITIAL = spec.b(problem.has_initial_state),
                HAS_FINAL = spec.b(problem.has_final_state),
                HAS_TOTAL = spec.b(problem.has_total_lengths64),
            },
        }
    end,
}
