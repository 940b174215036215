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

local fwd = import("la_fwd_sm90/family.lua")
local bwd = import("la_bwd/family.lua")

local PARTS = { [0] = "dq", [1] = "dv", [2] = "dk" }

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
        return fwd.valid(cfg, scan_problem(problem), device)
    end,

    default = function(problem, device)
        return fwd.default(scan_problem(problem), device)
    end,

    -- la_bwd's buckets, and the dq pass with ds in its own (another kernel).
    key = function(problem)
        local k = bwd.key(problem)
        if problem.part == 0 and problem.want_ds then
            k = k .. (problem.has_dsn and "_ds_dsn" or "_ds")
        end
        return k
    end,

    launch = function(cfg, problem, device)
        return fwd.launch(cfg, scan_problem(problem), device)
    end,

    resources = function(cfg, problem, device)
        return fwd.resources(cfg, scan_problem(problem), device)
    end,

    source = function(cfg, problem, device)
        local src = fwd.source(cfg, scan_problem(problem), device)
        src.consts.REVERSE = problem.part ~= 0 and "true" or "false"
        src.consts.GRAD_STATE = problem.part ~= 0 and "true" or "false"
        return src
    end,
}
