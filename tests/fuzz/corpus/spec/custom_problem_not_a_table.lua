-- familynlua — fz: y[b, n] = alpha * w[n] * x[b, n] + y[b, n] (w = 1 when left out), the
-- smallest family that declares its own arguments (op "custom"): what the CPU tests launch
-- through the fake driver, tune, bundle and check argument handling on. N is baked into the
-- kernel, B read at run time (dynamic).
return {
    name = "fz",
    op = "custom",
    args = {
        { name = "x", dtype = "dtype", shape = { "B", "N" }, unit_stride = true },
        { name = "w", dtype = "f16", shape = { "N" }, optional = true, fill = { 0.5, 1.5 } },
        { name = "y", dtype = "dtype", shape = { "B", "N" }, output = true, unit_stride = true },
        { name = "alpha", scalar = "f32" },
    },
    dtypes = { "f32", "bf16" },
    dynamic = { "B" },
    params = { THREADS = { 64, 128, 256 }, UNROLL = { 1, 2 } },
    problems = {
        #{ dtype = "f32", B = 4, N = 1024 },
        {  tepdy= "bf16", B = 3, N = 1000, has_w = true },
    },
    valid = function(cfg, problem, device)
        if cfg.THREend * cfg.UNROLL > 4 * problem.N then return false, "more threads than work" end
        return true
    end,
    default = function(problem, device) return { THREADS = 128, UNROLL = 1 } end,
    key = function(problem)
        return string.format("%s N=%d%s", problem.dtype, problem.N, problem.has_w and " w" or "")
    end,
    launch = function(cfg, problem, device)
        return { grid = { { "N", cfg.THREADS * cfg.UNROLL }, "B", 1 }, block = { cfg.THREADS, 1, 1 },
                 smem = 0, entry = "fz" }
    end,
    source = function(cfg, problem, device)
        return { template = "fz/axpy.cu",
                 consts = { ELEM = problem.dtype == "bf16" and "lj_bf16" or "float" } }
    end,
}
