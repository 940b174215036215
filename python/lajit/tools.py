"""tools — the `lajit` command shipped in the package, and tuning and bundles from Python.

The C API has no entry point for the tuner or for writing bundles (they live in the `lajit`
program: `lajit tune`, `lajit gen`), so lajit.tune() and lajit.gen_bundle() run the program
the wheel carries (_bin/lajit, linked with static Lua and SQLite) with NVRTC pointed at the
nvidia-cuda-nvrtc wheel, and return what it wrote. The console script `lajit` is main() below:
it sets up NVRTC the same way and replaces itself with the program. The console script itself
is lajit_cli.main, which does the same without importing this package (and torch)."""
import json
import os
import subprocess
import sys
import tempfile

from . import _native


def _env():
    _native.configure_nvrtc()
    return os.environ.copy()


def run(*args, check=True, capture=False):
    """Runs `lajit ARGS...`; returns the CompletedProcess. Raises LajitCliError on failure
    when check."""
    cmd = [_native.cli_path(), *map(str, args)]
    p = subprocess.run(cmd, env=_env(), text=True,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None)
    if check and p.returncode != 0:
        raise LajitCliError(cmd, p.returncode, p.stderr or "")
    return p


class LajitCliError(RuntimeError):
    def __init__(self, cmd, returncode, stderr):
        self.cmd, self.returncode, self.stderr = cmd, returncode, stderr
        super().__init__(f"{' '.join(cmd)} exited with {returncode}: {stderr.strip()}")


def _list(x):
    return ",".join(str(i) for i in x) if isinstance(x, (list, tuple)) else str(x)


def tune(family, *, dtype=None, B=None, H=None, N=None, D=None, E=None, T=None, decay=False,
         initial=False, final=False, vk=False, step_states=False, params=None, runs=None,
         warmup=None, jobs=None):
    """Tunes `family` on this machine's GPU 0 with `lajit tune` and stores the winners in the
    tuning database (tune.db in the cache directory, where contexts find them). B, H, N take
    lists. Returns the summary `lajit tune --json` writes (per bucket the default and the tuned
    configuration with their times)."""
    args = ["tune", "--family", family]
    for flag, val in (("--dtype", dtype), ("--B", B), ("--H", H), ("--N", N), ("--D", D),
                      ("--E", E), ("--T", T), ("--runs", runs), ("--warmup", warmup),
                      ("-j", jobs)):
        if val is not None:
            args += [flag, _list(val)]
    for flag, on in (("--decay", decay), ("--initial", initial), ("--final", final),
                     ("--vk", vk), ("--step-states", step_states)):
        if on:
            args.append(flag)
    for k, v in (params or {}).items():
        args += ["-p", f"{k}={v}"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tune.json")
        run(*args, "--json", path)
        with open(path) as f:
            return json.load(f)


def gen_bundle(out, *, arch=None, families=None, db=None, params=None, jobs=None):
    """Writes an offline kernel set (`lajit gen`) to `out`: kernels for the archs (list or
    comma-separated; default every supported arch), for the families (default all), with the
    tuned configurations of `db` where it has them. Open it with lajit.set_bundle(out) or
    LAJIT_BUNDLE=out so kernels launch without NVRTC. Returns out."""
    args = ["gen", "-o", out]
    if arch is not None:
        args += ["--arch", _list(arch)]
    if families is not None:
        args += ["--family", _list(families)]
    if db is not None:
        args += ["--db", db]
    if jobs is not None:
        args += ["-j", jobs]
    for k, v in (params or {}).items():
        args += ["-p", f"{k}={v}"]
    run(*args, capture=True)
    return out


def main():
    """The `lajit` console script: the shipped program, with NVRTC from the wheel."""
    env = _env()
    path = _native.cli_path()
    if not os.path.exists(path):
        sys.stderr.write(f"lajit: the lajit program is missing from the package ({path})\n")
        return 1
    os.execve(path, [path, *sys.argv[1:]], env)


if __name__ == "__main__":
    sys.exit(main())
