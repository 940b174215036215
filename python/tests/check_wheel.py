"""check_wheel.py — what a wheel of lajit must hold to run where Lua, SQLite and the CUDA toolkit
are absent (the GPU machine): every shared object and the lajit program present, each one's
dependencies resolved by ldd with LD_LIBRARY_PATH empty, Lua and SQLite resolved to the copies
inside the package (never the system's), RUNPATH $ORIGIN on liblajit, and no GLIBC symbol
version above the one the wheel's manylinux tag promises.

    python check_wheel.py WHEEL        exit 0 when every check holds, 1 otherwise"""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

EXPECTED = ["lajit/_lib/liblajit.so.0", "lajit/_lib/liblua5.4.so.0", "lajit/_lib/libsqlite3.so.0",
            "lajit/_bin/lajit", "lajit/__init__.py", "lajit/_native.py", "lajit/_torch.py",
            "lajit/api.py", "lajit/reference.py", "lajit/tools.py", "lajit_cli.py"]
BUNDLED = ("liblua", "libsqlite")


def main(wheel):
    failures = []
    name = os.path.basename(wheel)
    m = re.search(r"-py3-none-manylinux_(\d+)_(\d+)_x86_64\.whl$", name)
    if not m:
        failures.append(f"{name}: tag is not py3-none-manylinux_X_Y_x86_64")
        glibc_max = (0, 0)
    else:
        glibc_max = (int(m.group(1)), int(m.group(2)))
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            z.extractall(tmp)
            for info in z.infolist():
                if info.filename == "lajit/_bin/lajit" and not (info.external_attr >> 16) & 0o111:
                    failures.append("lajit/_bin/lajit is not executable in the wheel")
        for e in EXPECTED:
            if e not in names:
                failures.append(f"missing {e}")
        objects = [n for n in names if ".so" in os.path.basename(n) or n.endswith("_bin/lajit")]
        env = dict(os.environ, LD_LIBRARY_PATH="")
        for n in objects:
            path = os.path.join(tmp, n)
            out = subprocess.run(["ldd", path], env=env, capture_output=True, text=True).stdout
            print(f"== {n}\n{out.rstrip()}")
            if "not found" in out:
                failures.append(f"{n}: unresolved dependency:\n{out}")
            for line in out.splitlines():
                if "=>" not in line:
                    continue
                lib, _, target = line.strip().partition(" => ")
                if lib.startswith(BUNDLED):
                    where = target.split(" (")[0]
                    if not os.path.realpath(where).startswith(os.path.realpath(tmp)):
                        failures.append(f"{n}: {lib} resolves outside the package: {where}")
            dyn = subprocess.run(["readelf", "-d", "-W", path], capture_output=True,
                                 text=True).stdout
            if n.endswith("liblajit.so.0"):
                rp = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
                if rp != ["$ORIGIN"]:
                    failures.append(f"{n}: RUNPATH/RPATH {rp}, expected ['$ORIGIN']")
                for lib in BUNDLED:
                    if lib not in dyn:
                        failures.append(f"{n}: does not link {lib} (NEEDED entries changed?)")
            syms = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
            versions = {tuple(map(int, v.split(".")))
                        for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", syms)}
            top = max(versions, default=(0, 0))
            if top[:2] > glibc_max:
                failures.append(f"{n}: needs GLIBC_{'.'.join(map(str, top))}, above the tag's "
                                f"{glibc_max[0]}.{glibc_max[1]}")
    for f in failures:
        print("FAIL", f)
    print(f"{name}: {len(objects)} binaries checked, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
