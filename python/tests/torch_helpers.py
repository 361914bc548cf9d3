"""What the torch test files share (imported only after pytest.importorskip("torch")):
the devices present, the dtypes, the per-dtype tolerance and the relative error."""
import torch
from conftest import TOL, relerr

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tol(dtype):
    return TOL[str(dtype).replace("torch.", "")]


def err(a, b):
    return relerr(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy())
