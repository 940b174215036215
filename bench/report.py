#!/usr/bin/env python3
"""report.py — merges one run's lajit rows (lajit_bench's JSON lines) and the peers' rows
(../shared/peers/peer_bench.py --out) into docs/bench/<gpu>.json, the report format of
DESIGN.md, and writes <gpu>.md beside it with the tables and <gpu>.png with the plot.

Usage: report.py --lajit lajit.jsonl --peers peers.json --gpu h200 --commit SHA \
                 [--meta meta.json] [--out docs/bench] [--run NAME --join OLD.json]
--run tags this call's rows; --join carries over the rows of OLD.json whose `run` differs (an
earlier device call, e.g. the decode call beside a prefill call), each still compared only with
rows of its own call.
meta.json (optional) holds {"device", "cc", "driver"} as the driver reports them.
Every row must come from the same run on the same GPU; this script does not mix runs."""
import argparse, datetime, json, os

p = argparse.ArgumentParser()
p.add_argument("--lajit", required=True)
p.add_argument("--peers", required=True)
p.add_argument("--gpu", required=True)
p.add_argument("--commit", default="unknown")
p.add_argument("--meta", default=None)
p.add_argument("--out", default="docs/bench")
p.add_argument("--run", default=None)
p.add_argument("--join", default=None)
a = p.parse_args()

peers = json.load(open(a.peers))
lajit_rows = [json.loads(l) for l in open(a.lajit) if l.strip().startswith("{")]
meta = json.load(open(a.meta)) if a.meta and os.path.exists(a.meta) else {}

ceil = {}
for r in peers["rows"]:
    if r.get("kind") == "ceiling":
        key = {"d2d_copy_TBps": "copy_TBps", "bf16_mm_TFLOPs": "bf16_TFLOPs"}[r["what"]]
        ceil[key] = round(r["value"], 3)
copy = ceil.get("copy_TBps")


def floor_ms(op, B, H, N, D, E):
    if not copy:
        return None
    fwd = B * H * N * (2 * D + 2 * E) * 2
    bwd = B * H * N * (4 * D + 3 * E) * 2
    return round((fwd if op == "fwd" else fwd + bwd) / (copy * 1e12) * 1e3, 4)


rows = []
names = {"sdpa_causal": ("sdpa", False), "la2_nodecay": ("la2_nodecay", False),
         "la2_decay": ("la2_decay", True), "fla_simple_gla": ("fla", True)}
for r in peers["rows"]:
    if r.get("kind") == "prefill" and "fwd_ms" in r and r["name"] in names:
        impl, decay = names[r["name"]]
        B, H, N, D = r["B"], r["H"], r["N"], r["D"]
        base = dict(impl=impl, dtype=r.get("dtype", "bf16"), B=B, H=H, D=D, E=D, N=N, decay=decay)
        rows.append(dict(op="fwd", **base, ms=round(r["fwd_ms"], 4), floor_ms=floor_ms("fwd", B, H, N, D, D)))
        rows.append(dict(op="fwdbwd", **base, ms=round(r["fwdbwd_ms"], 4),
                         extra_MiB=round(r["peak_extra_MiB"], 1), floor_ms=floor_ms("fwdbwd", B, H, N, D, D)))
ceil_by_B = {r["B"]: r for r in peers["rows"] if r.get("kind") == "decode" and r.get("name") == "inplace_ceiling"}
for r in peers["rows"]:
    if r.get("kind") == "decode" and r.get("name", "").startswith("fla_fused_recurrent"):
        graph = r["name"].endswith("graph")
        c = ceil_by_B.get(r["B"])
        rows.append(dict(op="decode", impl="fla_graph" if graph else "fla_eager", B=r["B"], H=r["H"],
                         D=r["K"], E=r["V"], T=1, us=round(r["us"], 3), TBps=round(r["TBps"], 4),
                         ceiling_TBps=round(c["TBps"], 4) if c else None, l2=r["l2"],
                         how="CUDA graph of steps (peer_bench.py)" if graph else "eager Python call",
                         **({"run": r["run"]} if "run" in r else {})))
for r in lajit_rows:
    r = dict(r)
    if r.get("op") == "decode":
        # The ceiling is the faster of the two in-place updates of the same run: lajit_bench's
        # kernel and PyTorch's mul_ (peer_bench.py), both captured in a graph over the same
        # rotating states.
        c = ceil_by_B.get(r["B"]) if r.get("H") == 64 and r.get("D") == 128 else None
        if c and c["TBps"] > r.get("ceiling_TBps", 0):
            r["ceiling_TBps"] = round(c["TBps"], 4)
            r["ceiling_us"] = round(c["us"], 3)
            r["ceiling_from"] = "torch mul_ (peer_bench.py)"
        else:
            r["ceiling_from"] = "lajit_bench x *= c"
    if r.get("op") in ("fwd", "fwdbwd"):
        r["floor_ms"] = floor_ms(r["op"], r["B"], r["H"], r["N"], r["D"], r["E"])
    rows.append(r)

commit = a.commit
if a.run:
    for r in rows:
        r["run"] = a.run
if a.join:
    old = json.load(open(a.join))
    kept = [r for r in old["rows"] if r.get("run") and r.get("run") != a.run]
    rows = kept + rows
    runs = sorted({r["run"] for r in kept})
    prev = old.get("lajit", "")
    if "(" in prev:  # "sha (run); sha (run)": the entries of runs this call replaces go
        parts = [x.strip() for x in prev.split(";") if x.strip()]
        prev = "; ".join(x for x in parts if not x.endswith(f"({a.run})"))
    else:
        prev = f"{prev} ({', '.join(runs)})"
    commit = f"{a.commit} ({a.run})" + (f"; {prev}" if prev else "")
    if not ceil:  # a call that measured no ceilings (JIT rows only) keeps the report's
        ceil = old.get("ceilings", {})
rep = dict(device=meta.get("device", peers.get("device")), cc=meta.get("cc"), driver=meta.get("driver"),
           lajit=commit, date=datetime.date.today().isoformat(), ceilings=ceil, rows=rows)
os.makedirs(a.out, exist_ok=True)
jpath = os.path.join(a.out, a.gpu + ".json")
json.dump(rep, open(jpath, "w"), indent=1)

# ---- Markdown tables -------------------------------------------------------------------------
md = [f"# lajit benchmark — {rep['device']}", "",
      f"lajit {rep['lajit']}, {rep['date']}, driver {rep['driver']}; ceilings measured in the same run: "
      f"copy {ceil.get('copy_TBps')} TB/s, bf16 matmul {ceil.get('bf16_TFLOPs')} TFLOP/s. "
      "Every lajit row is compared only with peer rows measured in the same device call as it "
      "(lajit_bench and ../shared/peers/peer_bench.py together; rows carry `run` when a report "
      "joins several calls, and decode rows carry the ceiling of their own call). Times in ms (prefill) or µs (decode); lajit's prefill rows are with "
      "decay and compared with every peer, the no-decay ones included.", ""]
impls = ["lajit", "fla", "la2_decay", "la2_nodecay", "sdpa"]
for op in ("fwd", "fwdbwd"):
    ops = [r for r in rows if r.get("op") == op]
    if not ops:
        continue
    for D in sorted({r["D"] for r in ops}):
        md += [f"## {op}, bf16, B=4, H=32, D=E={D}", "",
               "| N | " + " | ".join(impls) + " | floor | lajit / best peer |",
               "|---" * (len(impls) + 3) + "|"]
        for N in sorted({r["N"] for r in ops if r["D"] == D}):
            cell = {}
            for r in ops:
                if r["D"] == D and r["N"] == N:
                    cell[r["impl"]] = r["ms"]
                    fl = r.get("floor_ms")
            peers_ms = [v for k, v in cell.items() if k != "lajit"]
            ratio = (f"{cell['lajit'] / min(peers_ms):.2f}" if "lajit" in cell and peers_ms else "—")
            md.append(f"| {N} | " + " | ".join(f"{cell[i]:.3f}" if i in cell else "—" for i in impls)
                      + f" | {fl if fl is not None else '—'} | {ratio} |")
        md.append("")
fb = [r for r in rows if r.get("op") == "fwdbwd"]
if fb:
    md += ["## fwdbwd: memory above the inputs during one call (MiB) and lajit with the decay gradient (ms)", "",
           "| D | N | lajit extra | fla extra | la2_decay extra | sdpa extra | lajit fwd+bwd | lajit fwd+bwd with ds |",
           "|---|---|---|---|---|---|---|---|"]
    for D in sorted({r["D"] for r in fb}):
        for N in sorted({r["N"] for r in fb if r["D"] == D}):
            cell = {r["impl"]: r for r in fb if r["D"] == D and r["N"] == N}
            ex = lambda i: f"{cell[i]['extra_MiB']:.0f}" if i in cell and "extra_MiB" in cell[i] else "—"
            l = cell.get("lajit", {})
            md.append(f"| {D} | {N} | {ex('lajit')} | {ex('fla')} | {ex('la2_decay')} | {ex('sdpa')} | "
                      f"{l.get('ms', float('nan')):.3f} | {l.get('ms_ds', float('nan')):.3f} |")
    md.append("")
jit = [r for r in rows if r.get("op") == "jit"]
if jit:
    md += ["## JIT start-up and tuning (wall seconds, each in a fresh process)", "",
           "| what | family | problem | s | default → tuned, or the bundle |", "|---|---|---|---|---|"]
    for r in jit:
        prob = r.get("problem") or f"bf16 B={r.get('B')} H={r.get('H')} N={r.get('N')} D={r.get('D')}"
        tuned = (f"{r['default_config']} {r['default_ms']:.4f} ms → {r['tuned_config']} {r['tuned_ms']:.4f} ms "
                 f"({r['default_ms'] / r['tuned_ms']:.2f}×)" if "tuned_ms" in r else
                 f"bundle {r['bundle']}, NVRTC {r.get('nvrtc', 'present')}" if "bundle" in r else "")
        md.append(f"| {r['what']} | {r['family']} | {prob} | {r['s']:.4f} | {tuned} |")
    md.append("")
dec = [r for r in rows if r.get("op") == "decode"]
if dec:
    md += ["## decode, H=64, D=E=128, bf16 q/k/v, fp32 state, cold L2 (µs per step, TB/s, % of the in-place ceiling)", "",
           "| B | T | lajit | FLA (graph) | in-place ceiling | lajit % of ceiling |", "|---|---|---|---|---|---|"]
    for T in sorted({r.get("T", 1) for r in dec}):
        for B in sorted({r["B"] for r in dec}):
            l = next((r for r in dec if r["impl"] == "lajit" and r["B"] == B and r.get("T", 1) == T), None)
            f = next((r for r in dec if r["impl"] == "fla_graph" and r["B"] == B and r.get("l2") == "cold" and T == 1), None)
            if not l and not f:
                continue
            ls = f"{l['us']:.1f} ({l['TBps']:.2f})" if l else "—"
            fs = f"{f['us']:.1f} ({f['TBps']:.2f})" if f else "—"
            cs = f"{l['ceiling_us']:.1f} ({l['ceiling_TBps']:.2f})" if l and "ceiling_us" in l else "—"
            pct = f"{100 * l['TBps'] / l['ceiling_TBps']:.1f} %" if l and l.get("ceiling_TBps") else "—"
            md.append(f"| {B} | {T} | {ls} | {fs} | {cs} | {pct} |")
    md.append("")
cp = [r for r in rows if r.get("op") == "cp"]
if cp:
    md += ["## Context parallelism (lajit_bench --mode cp): one layer, bf16 with decay, ms "
           "(the slowest rank per repetition, median)", "",
           "| scaling | exchange | GPUs | B | H | D | tokens per GPU | fwd+bwd | exchange ms | "
           "exchange share | efficiency t(1)/t(P) | fwd | fwd efficiency |", "|---" * 13 + "|"]
    for r in sorted(cp, key=lambda r: (r.get("scaling", ""), r.get("exchange", ""), r["gpus"])):
        f = lambda k, fmt="{:.3f}": fmt.format(r[k]) if isinstance(r.get(k), (int, float)) else "—"
        md.append(f"| {r.get('scaling', '—')} | {r.get('exchange', '—')} | {r['gpus']} | {r['B']} | {r['H']} | {r['D']} | {r['N']} | "
                  f"{f('ms')} | {f('exchange_ms')} | {f('exchange_share', '{:.1%}')} | "
                  f"{f('weak_efficiency', '{:.2f}')} | {f('ms_fwd')} | {f('weak_efficiency_fwd', '{:.2f}')} |")
    md.append("")
disp = [r for r in rows if r.get("op") == "dispatch"]
for r in disp:
    md += [f"Host cost of one `{r.get('what')}` call on a cached kernel: {r['us_host']:.3f} µs; a bare "
           f"cuLaunchKernel of an empty kernel: {r['us_launch']:.3f} µs ({r.get('how', '')}).", ""]

# ---- Plot: time against N, log-log, per D -----------------------------------------------------
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pre = [r for r in rows if r.get("op") in ("fwd", "fwdbwd")]
    Ds = sorted({r["D"] for r in pre})
    ops_present = [o for o in ("fwd", "fwdbwd") if any(r["op"] == o for r in pre)]
    if Ds and ops_present:
        fig, axes = plt.subplots(len(ops_present), len(Ds), figsize=(6 * len(Ds), 4.5 * len(ops_present)), squeeze=False)
        for i, op in enumerate(ops_present):
            for j, D in enumerate(Ds):
                ax = axes[i][j]
                for impl in impls:
                    pts = sorted((r["N"], r["ms"]) for r in pre if r["op"] == op and r["D"] == D and r["impl"] == impl)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", label=impl, linewidth=2.5 if impl == "lajit" else 1.2)
                fl = sorted({(r["N"], r["floor_ms"]) for r in pre if r["op"] == op and r["D"] == D and r.get("floor_ms")})
                if fl:
                    ax.plot(*zip(*fl), "k--", label="bandwidth floor")
                ax.set_xscale("log", base=2); ax.set_yscale("log")
                ax.set_title(f"{op}, bf16, B=4, H=32, D=E={D}"); ax.set_xlabel("N"); ax.set_ylabel("ms")
                ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
        fig.suptitle(f"lajit vs peers on {rep['device']} (one run)")
        fig.tight_layout()
        png = os.path.join(a.out, a.gpu + ".png")
        fig.savefig(png, dpi=110)
        md.insert(4, f"![time against N]({a.gpu}.png)\n")
    dec_l = sorted((r["B"], r["us"]) for r in rows if r.get("op") == "decode" and r.get("impl") == "lajit" and r.get("T", 1) == 1)
    if dec_l:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        ax.plot(*zip(*dec_l), marker="o", linewidth=2.5, label="lajit (T=1)")
        fla = sorted((r["B"], r["us"]) for r in rows if r.get("op") == "decode" and r.get("impl") == "fla_graph" and r.get("l2") == "cold")
        if fla:
            ax.plot(*zip(*fla), marker="o", label="FLA fused_recurrent (graph)")
        ceil_pts = sorted((r["B"], r["ceiling_us"]) for r in rows if r.get("op") == "decode" and r.get("impl") == "lajit" and r.get("T", 1) == 1 and "ceiling_us" in r)
        if ceil_pts:
            ax.plot(*zip(*ceil_pts), "k--", label="in-place update ceiling")
        ax.set_xscale("log", base=2); ax.set_yscale("log")
        ax.set_xlabel("B (H=64, D=E=128, cold L2)"); ax.set_ylabel("µs per step")
        ax.set_title(f"decode on {rep['device']} (one run)")
        ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, a.gpu + "-decode.png"), dpi=110)
        md.insert(4, f"![decode time against B]({a.gpu}-decode.png)\n")
except ImportError:
    md.append("(matplotlib missing: no plot)")
open(os.path.join(a.out, a.gpu + ".md"), "w").write("\n".join(md) + "\n")
print(f"wrote {jpath} ({len(rows)} rows)")
