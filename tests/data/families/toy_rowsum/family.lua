-- family.lua — toy_rowsum: y[b] = Σ_n x[b, n], each row summed by PARTS CTAs that meet in the
-- family's workspace (a workspace argument, sized per launch by launch()): each CTA writes its
-- partial sum there and takes a ticket; the last CTA of a row adds the partials in a fixed order
-- (the same bits on every run) and resets the row's ticket, so the workspace is left as it was
-- found. PARTS = 1 needs no workspace (launch() says 0 bytes and the argument arrives NULL). What
-- the CPU tests use to check the workspace's packing, sizing and reuse through the fake driver.
local function ws_per_row(cfg)
    return 16 + 16 * ((4 * cfg.PARTS + 15) // 16) -- a 16-byte ticket, then the partial sums
end

return {
    name = "toy_rowsum",
    op = "custom",
    args = {
        { name = "ws", workspace = true },
        { name = "x", dtype = "f32", shape = { "B", "N" }, unit_stride = true },
        { name = "y", dtype = "f32", shape = { "B" }, output = true },
    },
    dtypes = { "f32" },
    dynamic = { "B" },
    params = { THREADS = { 128, 256 }, PARTS = { 1, 4 } },
    problems = {
        { dtype = "f32", B = 8, N = 4096 },
    },
    valid = function(cfg, problem, device)
        if cfg.THREADS * cfg.PARTS > problem.N then return false, "more threads than elements" end
        return true
    end,
    default = function(problem, device) return { THREADS = 128, PARTS = 4 } end,
    key = function(problem) return string.format("N=%d", problem.N) end,
    launch = function(cfg, problem, device)
        return { grid = { cfg.PARTS, "B", 1 }, block = { cfg.THREADS, 1, 1 }, smem = 0,
                 entry = "toy_rowsum",
                 workspace = cfg.PARTS > 1 and { per = ws_per_row(cfg), times = { "B" } } or 0 }
    end,
    source = function(cfg, problem, device)
        return { template = "toy_rowsum/rowsum.cu", consts = { WS_ROW = ws_per_row(cfg) } }
    end,
}
