-- spec.lua — the small helpers every family spec shares (imported with import("common/spec.lua")):
-- the element types and sizes, the log2 buckets of key(), the checks valid() repeats (dtype, head
-- widths, a tile dividing E, shared memory against the device) and the flags and bucket key of the
-- forward's chunk scans. One copy here, so a family cannot drift from another's rules.

local M = {}

-- Template element type and its size in bytes, per dtype.
M.ELEM = { f32 = "float", f16 = "lj_f16", bf16 = "lj_bf16" }
M.ESIZE = { f32 = 4, f16 = 2, bf16 = 2 }

-- ⌊log2 x⌋ (0 for x < 2): the size buckets of key().
function M.log2_bucket(x)
    local b = 0
    while (1 << (b + 1)) <= x do b = b + 1 end
    return b
end

-- The smallest power of two ≥ x (1 for x ≤ 1).
function M.pow2ceil(x)
    local r = 1
    while r < x do r = r * 2 end
    return r
end

-- A Lua boolean as the CUDA literal a template bakes in.
function M.b(x) return x and "true" or "false" end

-- A copy of cfg with the fields of changes replaced.
function M.with(cfg, changes)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    for k, v in pairs(changes or {}) do c[k] = v end
    return c
end

-- valid()'s shared checks: each returns true, or false and the reason.
function M.check_dtype(problem, elem)
    if (elem or M.ELEM)[problem.dtype] == nil then return false, "dtype must be f32, f16 or bf16" end
    return true
end

function M.check_dims(problem)
    local D, E = problem.D, problem.E
    if D % 16 ~= 0 or E % 16 ~= 0 or D < 16 or E < 16 or D > 256 or E > 256 then
        return false, "D and E must be multiples of 16 from 16 to 256"
    end
    return true
end

-- `width` columns per CTA (or warpgroup set) must divide E.
function M.check_tile(width, E, what)
    if width > E or E % width ~= 0 then
        return false, string.format("%s=%d does not divide E=%d", what or "TILE_V", width, E)
    end
    return true
end

function M.check_smem(bytes, device)
    if bytes > device.smem_optin then
        return false, string.format("%d bytes of shared memory (device allows %d)", bytes,
                                    device.smem_optin)
    end
    return true
end

-- The registers a thread may have when `threads` threads and `minb` CTAs share an SM (what
-- __launch_bounds__(threads, minb) lets ptxas use): the register claim of resources().
function M.reg_cap(device, threads, minb)
    return math.min(255, device.regs_per_sm // (threads * (minb or 1)))
end

-- The states' storage type (STATE_T of the kernels) and o's element type (OUT_ELEM): f32 states
-- and an o of the problem's dtype unless the problem says otherwise.
function M.state_dtype(problem) return problem.state_dtype or "f32" end
function M.out_dtype(problem) return problem.out_dtype or problem.dtype end

-- What a key appends for a 16-bit state storage and a mixed output ("_sbf16", "_obf16"): nothing
-- for the defaults, so the buckets (and tuned winners) of every existing problem are unchanged.
function M.dtype_suffix(problem)
    local s, o = M.state_dtype(problem), M.out_dtype(problem)
    return (s ~= "f32" and "_s" .. s or "") .. (o ~= problem.dtype and "_o" .. o or "")
end

-- valid()'s check of the storage and output dtypes: any state storage; o of the problem's dtype,
-- or one fp32 side with one 16-bit side (f16 with bf16 is refused).
function M.check_io_dtypes(problem)
    local s, o = M.state_dtype(problem), M.out_dtype(problem)
    if M.ELEM[s] == nil then return false, "state_dtype must be f32, f16 or bf16" end
    if M.ELEM[o] == nil then return false, "out_dtype must be f32, f16 or bf16" end
    if o ~= problem.dtype and o ~= "f32" and problem.dtype ~= "f32" then
        return false, string.format("o of %s with %s inputs (a mixed call has one f32 side)", o,
                                    problem.dtype)
    end
    return true
end

-- The tuning bucket of a forward scan (la_fwd, la_fwd_sm90): dtype, head widths, flags, and the
-- log2 buckets of N and B·H.
function M.fwd_key(problem)
    return string.format("%s_D%d_E%d_%s%s%s%s%s%s_n%d_bh%d", problem.dtype, problem.D, problem.E,
                         problem.decay and "decay" or "nodecay",
                         problem.has_initial and "_s0" or "",
                         problem.has_final and (problem.state_only and "_state" or "_sn") or "",
                         problem.varlen and "_varlen" or "", problem.vk and "_vk" or "",
                         M.dtype_suffix(problem), M.log2_bucket(math.max(problem.N, 1)),
                         M.log2_bucket(problem.B * problem.H))
end

-- The constants a forward scan template (la_fwd/fwd.cu, la_fwd_sm90/fwd.cu) takes from the
-- problem: element type, head widths and the specialisation flags (a forward: not reversed, no
-- gradient state; la_bwd's passes set REVERSE and GRAD_STATE themselves).
function M.scan_consts(problem, elem)
    return {
        ELEM = (elem or M.ELEM)[problem.dtype],
        STATE_T = M.ELEM[M.state_dtype(problem)], -- storage of S_0 / S_N (fp32 accumulation)
        OUT_ELEM = M.ELEM[M.out_dtype(problem)],  -- o's element type
        D = problem.D,
        E = problem.E,
        DECAY = M.b(problem.decay),
        HAS_INITIAL = M.b(problem.has_initial),
        HAS_FINAL = M.b(problem.has_final),
        VARLEN = M.b(problem.varlen),
        REVERSE = "false",
        GRAD_STATE = "false",
        STATE_ONLY = M.b(problem.state_only), -- the final state only: no o, no q
    }
end

return M
