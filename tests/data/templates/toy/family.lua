-- A test family: every feature of the spec contract and the template syntax, no real kernel.
return {
    name = "toy",
    op = "fwd",
    params = { UNROLL = { 1, 2, 4 }, WARPS = { 1, 2 } },
    problems = {
        { dtype = "bf16", B = 2, H = 3, N = 100, D = 32, E = 16, decay = true },
        { dtype = "f32", B = 1, H = 1, N = 7, D = 16, decay = false },
    },
    valid = function(cfg, problem, device)
        if cfg.UNROLL > problem.D // 8 then
            return false, string.format("UNROLL=%d exceeds D/8=%d", cfg.UNROLL, problem.D // 8)
        end
        return true
    end,
    default = function(problem, device)
        return { UNROLL = problem.D >= 32 and 4 or 2, WARPS = device.cc >= 90 and 2 or 1 }
    end,
    key = function(problem) return problem.dtype .. "_D" .. problem.D end,
    launch = function(cfg, problem, device)
        return { grid = { { "N", 64 }, "H", "B" }, block = { cfg.WARPS * 32, 1, 1 },
                 smem = 1024 * cfg.UNROLL, entry = "toy_kernel" }
    end,
    source = function(cfg, problem, device)
        return { template = "toy/toy.cu", consts = { SCALE = 0.5, NAME = "toy_kernel" } }
    end,
}
