"""Shared helpers: fresh random inputs each run (seed printed; FG_TEST_SEED replays),
the relative-error metric and the per-dtype tolerances of DESIGN.md."""
import os
import time

import numpy as np
import pytest

def data(rng, shape):
    """Test data, uniform in [-0.5, 1): the nonzero mean keeps sums from cancelling, so
    the per-dtype tolerances measure the kernel rather than an ill-conditioned reference."""
    return rng.uniform(-0.5, 1.0, size=shape)


TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def relerr(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return np.inf
    den = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    return num / den if den > 0 else num


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FG_TEST_SEED", time.time_ns() % (2**32)))
    print(f"{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)
