"""fastgrad._torchext: the torch C++ extension of _torchext.cpp (fg.Linear's, linear + activation's,
the row norms' and the encoder layer's forward and backward with their autograd in C++, so that a call through
autograd never enters Python's torch.autograd.Function machinery, and the normalization family's functional calls):
building it, finding it, handing it the library.

The extension is optional. CMake builds it ahead of time beside libfastgrad when torch and its
headers are importable (`python3 python/fastgrad/_torchext.py OUT_DIR` does the same by hand:
torch.utils.cpp_extension compiles it with torch's own flags; the objects stay in
OUT_DIR/torchext). Without it, or with FASTGRAD_NO_TORCHEXT=1 / FASTGRAD_NO_EXT=1,
fg.Linear, fg.LinearAct, the norms and the encoder layers run their Python (autograd.Functions, norm.py's
functions), with the same kernels and the same bits.
CUDA code (torch's current stream) is compiled in only when torch has CUDA and the CUDA
headers are found; without it, CUDA tensors take the Python path.
"""
import importlib.util
import os
import sys

NAME = "_torchext_ops"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_build():
    """Whether the build can compile the CUDA part: torch built with CUDA and CUDA's headers."""
    import torch
    from torch.utils import cpp_extension as ce
    return bool(torch.version.cuda) and ce.CUDA_HOME is not None and os.path.exists(
        os.path.join(ce.CUDA_HOME, "include", "cuda_runtime_api.h"))


def build(out_dir, verbose=False):
    """Compiles _torchext.cpp into out_dir/_torchext_ops.so (objects in out_dir/torchext) and
    returns that path. Needs torch with its headers and a C++ compiler (ninja optional)."""
    import shutil

    from torch.utils import cpp_extension as ce
    include = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "include")
    work = os.path.join(os.path.abspath(out_dir), "torchext")
    os.makedirs(work, exist_ok=True)
    cuda = _cuda_build()
    if cuda:  # only .cpp sources: no device code, but cpp_extension wants an arch list without a GPU
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

    def compile_it(cuda):
        cflags = ["-O2", "-fvisibility=hidden"] + (["-DFG_TORCHEXT_CUDA"] if cuda else [])
        ce.load(NAME, [os.path.join(_HERE, "_torchext.cpp")], extra_cflags=cflags, extra_include_paths=[include],
                build_directory=work, with_cuda=cuda, verbose=verbose, is_python_module=False)

    try:
        compile_it(cuda)
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA toolkit torch refuses: the CPU part still helps
        if not cuda:
            raise
        print(f"fastgrad: the torch extension's CUDA part did not build ({type(e).__name__}: "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); building it for CPU tensors only",
              file=sys.stderr)
        compile_it(False)
    skipped = os.path.join(work, "skipped")
    if os.path.exists(skipped):
        os.remove(skipped)
    built = os.path.join(work, NAME + ".so")
    dest = os.path.join(os.path.abspath(out_dir), NAME + ".so")
    tmp = dest + ".tmp"
    shutil.copy2(built, tmp)
    os.replace(tmp, dest)  # a process that has the old one loaded keeps its mapping
    return dest


def _load(lib_name):
    """(module, None), or (None, why not): _torchext_ops from the loaded library's folder, then
    from this package's."""
    if os.environ.get("FASTGRAD_NO_EXT", "") not in ("", "0"):
        return None, "FASTGRAD_NO_EXT is set"
    if os.environ.get("FASTGRAD_NO_TORCHEXT", "") not in ("", "0"):
        return None, "FASTGRAD_NO_TORCHEXT is set"
    folders = [os.path.dirname(os.path.abspath(lib_name))] if os.path.sep in lib_name else []
    folders += [_HERE] if _HERE not in folders else []
    for folder in folders:
        path = os.path.join(folder, NAME + ".so")
        if not os.path.exists(path):
            continue
        try:
            import torch  # noqa: F401 - the module links torch's libraries, loaded by this import
            spec = importlib.util.spec_from_file_location(__package__ + "." + NAME, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (ImportError, OSError) as e:
            return None, f"{path} does not load (built for another torch? rebuild): {e}"
        return module, None
    why = "not built (no " + NAME + ".so in " + ", ".join(folders) + ")"
    for folder in folders:
        skipped = os.path.join(folder, "torchext", "skipped")
        if os.path.exists(skipped):
            with open(skipped) as f:
                why += "; the build said: " + f.read().strip()
    return None, why


def _configure(module):
    """Hands the module the entry points of the library ctypes loaded; (module, None) or
    (None, why) when it refuses this library."""
    import ctypes

    from . import _lib
    names = ["fg_context_create", "fg_context_destroy", "fg_context_set_stream", "fg_plan_create", "fg_plan_destroy",
             "fg_plan_workspace_size", "fg_plan_run", "fg_last_error", "fg_status_string", "fg_encoder_layer_sizes",
             "fg_encoder_layer_forward_ws", "fg_encoder_layer_backward"]
    fns = {n: ctypes.cast(getattr(_lib.lib, n), ctypes.c_void_p).value for n in names}
    sizes = [_lib.abi_layout("fg_tensor"), _lib.MAX_RANK, _lib.MAX_OPERANDS, _lib.abi_layout("fg_plan_desc")]
    try:
        module.configure(fns, sizes, _lib.VERSION)
    except (ValueError, TypeError) as e:
        return None, str(e)
    return module, None


def _init():
    from . import _lib
    module, why = _load(_lib.lib._name)
    if module is not None:
        module, why = _configure(module)
    return module, why


# MODULE: the extension, loaded and configured, or None (WHY_NOT says why)
MODULE, WHY_NOT = _init() if __name__ != "__main__" else (None, "run as a script")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=f"builds {NAME}.so (the torch C++ extension) in OUT_DIR")
    ap.add_argument("out_dir")
    ap.add_argument("--optional", action="store_true",
                    help="on failure say why (in OUT_DIR/torchext/skipped too) and exit 0: the build goes on "
                         "without the extension")
    ap.add_argument("--stamp", help="touch this file when done (built or skipped): the build system's output")
    a = ap.parse_args()
    try:
        print(build(a.out_dir, verbose=os.environ.get("VERBOSE", "") not in ("", "0")))
        status = 0
    except Exception as e:  # noqa: BLE001 - any failure: no extension, said once
        if not a.optional:
            raise
        why = f"{type(e).__name__}: {e}".strip().splitlines()[0]
        print(f"fastgrad: the torch C++ extension {NAME} was not built ({why}); fg.Linear, fg.LinearAct and "
              "the norms run their Python", file=sys.stderr)
        os.makedirs(os.path.join(a.out_dir, "torchext"), exist_ok=True)
        with open(os.path.join(a.out_dir, "torchext", "skipped"), "w") as f:
            f.write(why + "\n")
        stale = os.path.join(a.out_dir, NAME + ".so")
        if os.path.exists(stale):  # an older build that no longer matches the sources
            os.remove(stale)
        status = 0
    if a.stamp:
        with open(a.stamp, "w") as f:
            f.write("")
    sys.exit(status)
