"""lajit_cli — the `lajit` console script: runs the program inside the lajit package with NVRTC
pointed at the nvidia-cuda-nvrtc wheel (as `import lajit` does), without importing the package
itself (and so torch): lajit/_native.py is loaded on its own, by path."""
import importlib.util
import os
import sys


def main():
    spec = importlib.util.find_spec("lajit")
    if spec is None or not spec.submodule_search_locations:
        sys.stderr.write("lajit: the lajit package is not installed\n")
        return 1
    pkg = list(spec.submodule_search_locations)[0]
    nspec = importlib.util.spec_from_file_location("_lajit_native_cli",
                                                   os.path.join(pkg, "_native.py"))
    native = importlib.util.module_from_spec(nspec)
    nspec.loader.exec_module(native)
    native.configure_nvrtc()
    path = native.cli_path()
    if not os.path.exists(path):
        sys.stderr.write(f"lajit: the lajit program is missing from the package ({path})\n")
        return 1
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
