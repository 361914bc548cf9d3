"""fastgrad: fused forward and backward training kernels, from Python.

    import fastgrad as fg
    y = fg.linear_forward(x, w, b)          # numpy arrays (CPU) or torch tensors (CPU/CUDA)
    layer = fg.Linear(1024, 4096).cuda()    # with torch: autograd modules

Errors raise fastgrad.FastgradError carrying the C status and message. The ABI (enum
values, ops and their operands) is read from the loaded library, and the ctypes structs
are checked against it at import (fastgrad.AbiError when they differ).
"""
from ._lib import AbiError, FastgradError, version
from .ops import (adamw_step, attention_backward, attention_forward, attention_options, axpby_backward, axpby_forward,
                  context_check, last_kernels, lerp_backward, lerp_forward,
                  linear_act_backward, linear_act_forward, linear_backward_bias, linear_backward_input,
                  linear_backward_weight, linear_cross_entropy_onepass,
                  linear_forward, linear_logp_backward, linear_logp_forward, linear_logp_shard_combine,
                  linear_logp_shard_forward, logp_options, matmul_backward_input,
                  matmul_backward_other, matmul_forward, outer_backward_input, outer_backward_other, outer_forward,
                  plan_info, release_workspace, set_allow_tf32, unary_backward, unary_forward, workspace_bytes)
from .encoder import (encoder_backward, encoder_desc, encoder_forward, encoder_layer_backward, encoder_layer_forward,
                      encoder_layer_sizes, encoder_sizes)
from .norm import (batch_norm_apply, batch_norm_backward, batch_norm_backward_apply, batch_norm_backward_stats,
                   batch_norm_forward, batch_norm_stats, dropout_backward, dropout_forward, layer_norm_forward,
                   norm_backward, norm_forward, rms_norm_forward, revin_backward, revin_forward, revin_stats)

__version__ = version()

try:
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - no torch in CI
    pass
else:
    from .autograd import Attention, AttentionFunction, attention  # noqa: F401
    from .distributed import (SyncBatchNorm, convert_sync_batchnorm, sync_batch_norm,  # noqa: F401
                              vocab_parallel_cross_entropy, vocab_parallel_logp)
    from .encoder import (EncoderLayerFunction, EncoderStackFunction, PatchTSTEncoder,  # noqa: F401
                          PatchTSTEncoderLayer, TransformerEncoderLayer)
    from .norm import (BatchNorm1d, Dropout, LayerNorm, RevIN, RMSNorm, add_norm, batch_norm,  # noqa: F401
                       dropout, layer_norm, rms_norm)
    from .autograd import (ELU, AdamW, Clamp, LeakyReLU, Lerp, Linear, LinearAct, LinearCrossEntropy, LinearFunction,
                           Matmul, MatmulFunction, Outer, OuterFunction, Softcap, axpby, clamp, elu, leaky_relu, lerp,
                           linear, linear_act, linear_cross_entropy, linear_logp, matmul, outer, pow, scale, softcap)
