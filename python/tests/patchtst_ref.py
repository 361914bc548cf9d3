"""A plain PyTorch model of the reference PatchTST backbone's encoder (yuqinie98/PatchTST,
PatchTST_backbone.py: TSTEncoder → TSTEncoderLayer → _MultiheadAttention →
_ScaledDotProductAttention), written here from its documented behaviour with the same module
tree, so its state_dict has the reference's keys: what fg.PatchTSTEncoder is compared with
(test_torch_encoder.py) and timed against (bench/compare_encoder.py).

Per layer (post-norm, the reference's default):
  q, k, v = W_Q(x), W_K(x), W_V(x) split into heads; s = q·kᵀ·scale (+ the previous layer's s
  when res_attention), masked with -inf (attn_mask [L, L], key_padding_mask [B, L]);
  a = to_out(concat_heads(attn_dropout(softmax(s))·v))        to_out = (Linear, Dropout)
  x = norm_attn(x + dropout_attn(a))                           BatchNorm1d over every token
  x = norm_ffn(x + dropout_ffn(ff(x)))                         ff = Linear, GELU, Dropout, Linear
and the layer hands s (before the softmax, masked) to the next one.
"""
import torch
from torch import nn
import torch.nn.functional as F


class Transpose(nn.Module):
    def __init__(self, *dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.transpose(*self.dims)


def activation_module(activation):
    if callable(activation) and not isinstance(activation, str):
        return activation()
    return {"relu": nn.ReLU, "gelu": nn.GELU}[activation.lower()]()


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model, n_heads, attn_dropout=0.0, res_attention=False):
        super().__init__()
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.res_attention = res_attention
        self.scale = nn.Parameter(torch.tensor((d_model // n_heads) ** -0.5), requires_grad=False)
        self.lsa = False

    def forward(self, q, k, v, prev=None, key_padding_mask=None, attn_mask=None):
        # q [B, H, L, hd], k [B, H, hd, L] (already transposed), v [B, H, L, hd]
        s = torch.matmul(q, k) * self.scale
        if prev is not None:
            s = s + prev
        if attn_mask is not None:
            s = s.masked_fill(attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        w = self.attn_dropout(F.softmax(s, dim=-1))
        return torch.matmul(w, v), w, s


class MultiheadAttention(nn.Module):
    def __init__(self, d_model, n_heads, res_attention=False, attn_dropout=0.0, proj_dropout=0.0):
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_model // n_heads, d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=True)
        self.W_K = nn.Linear(d_model, d_model, bias=True)
        self.W_V = nn.Linear(d_model, d_model, bias=True)
        self.res_attention = res_attention
        self.sdp_attn = ScaledDotProductAttention(d_model, n_heads, attn_dropout, res_attention)
        self.to_out = nn.Sequential(nn.Linear(d_model, d_model), nn.Dropout(proj_dropout))

    def forward(self, x, prev=None, key_padding_mask=None, attn_mask=None):
        b, l, _ = x.shape
        q = self.W_Q(x).view(b, l, self.n_heads, self.d_k).transpose(1, 2)
        k = self.W_K(x).view(b, l, self.n_heads, self.d_k).permute(0, 2, 3, 1)
        v = self.W_V(x).view(b, l, self.n_heads, self.d_v).transpose(1, 2)
        o, w, s = self.sdp_attn(q, k, v, prev, key_padding_mask, attn_mask)
        o = o.transpose(1, 2).reshape(b, l, self.n_heads * self.d_v)
        return self.to_out(o), w, s


def norm_block(norm, d_model):
    if "batch" in norm.lower():
        return nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))
    return nn.LayerNorm(d_model)


class TSTEncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=256, norm="BatchNorm", attn_dropout=0.0, dropout=0.0, bias=True,
                 activation="gelu", res_attention=False):
        super().__init__()
        self.res_attention = res_attention
        self.self_attn = MultiheadAttention(d_model, n_heads, res_attention, attn_dropout, dropout)
        self.dropout_attn = nn.Dropout(dropout)
        self.norm_attn = norm_block(norm, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff, bias=bias), activation_module(activation),
                                nn.Dropout(dropout), nn.Linear(d_ff, d_model, bias=bias))
        self.dropout_ffn = nn.Dropout(dropout)
        self.norm_ffn = norm_block(norm, d_model)

    def forward(self, x, prev=None, key_padding_mask=None, attn_mask=None):
        a, _, s = self.self_attn(x, prev if self.res_attention else None, key_padding_mask, attn_mask)
        x = self.norm_attn(x + self.dropout_attn(a))
        x = self.norm_ffn(x + self.dropout_ffn(self.ff(x)))
        return (x, s) if self.res_attention else x


class TSTEncoder(nn.Module):
    """The reference's TSTEncoder(q_len, d_model, n_heads, d_ff, norm, attn_dropout, dropout,
    activation, res_attention, n_layers) with the same state_dict keys."""

    def __init__(self, n_layers=3, d_model=128, n_heads=16, d_ff=256, dropout=0.2, attn_dropout=0.0,
                 activation="gelu", res_attention=True, norm="BatchNorm"):
        super().__init__()
        self.layers = nn.ModuleList([TSTEncoderLayer(d_model, n_heads, d_ff, norm, attn_dropout, dropout, True,
                                                     activation, res_attention) for _ in range(n_layers)])
        self.res_attention = res_attention

    def forward(self, src, key_padding_mask=None, attn_mask=None):
        out, scores = src, None
        for layer in self.layers:
            if self.res_attention:
                out, scores = layer(out, scores, key_padding_mask, attn_mask)
            else:
                out = layer(out, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        return out
