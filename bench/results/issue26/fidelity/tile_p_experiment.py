# An experiment (issue 26 item 3, helper kfid, session 10; run from tests/reference:
#   cd tests/reference && PYTHONPATH=. python3 ../../bench/results/issue26/fidelity/tile_p_experiment.py): LayerStream's int8 algorithm approximated in PyTorch
# (docs/int8-attention.md: our sign vector and unnormalised FWHT, midrange centre, per-row
# scales, per-channel V, P8 = rint(255 * 2^(s - ref)), row sum of 22-bit pl), with P's
# reference either the running maximum (ours) or each 128-key tile's own maximum.
import torch, math
from int8_attention_ref import *
def sign_vec(D):
    return torch.tensor([-1.0 if ((c * 2654435761) & 0xffffffff) >> 31 else 1.0 for c in range(D)])
def rot(x):
    D = x.shape[-1]; x = x * sign_vec(D); s = 1
    from int8_attention_ref import _butterfly
    while s < D:
        x = _butterfly(x, s); s *= 2
    return x
def ours(q, k, v, tile_ref):
    H, Mq, D = q.shape; Mk = k.shape[1]
    mu = 0.5 * (k.amax(1, keepdim=True) + k.amin(1, keepdim=True))
    kr = rot(k - mu); qr = rot(q)
    sk = torch.clamp(kr.abs().amax(-1) * f32(1/127), min=1e-30); sq = torch.clamp(qr.abs().amax(-1) * f32(1/127), min=1e-30)
    k8 = torch.round(kr / sk[..., None]).clamp(-127, 127); q8 = torch.round(qr / sq[..., None]).clamp(-127, 127)
    sv = torch.clamp(v.abs().amax(1) * f32(1/127), min=1e-30); v8 = torch.round(v / sv[:, None, :]).clamp(-127, 127)
    cs = f32(f32(1/math.sqrt(D)) * f32(1.4426950408889634)) / D
    s = torch.matmul(q8.double(), k8.double().transpose(-1, -2)).float() * (sq[..., None] * cs) * sk[:, None, :]
    m = torch.full((H, Mq), -float('inf')); l = torch.zeros(H, Mq); acc = torch.zeros(H, Mq, D)
    for j0 in range(0, Mk, 128):
        st = s[:, :, j0:j0+128]; tm = st.amax(-1); mn = torch.maximum(m, tm)
        alpha = torch.exp2(m - mn)
        ref = tm if tile_ref else mn
        beta = torch.exp2(tm - mn) if tile_ref else torch.ones_like(mn)
        e = 255 * torch.exp2(st - ref[..., None])
        p8 = torch.round(e).clamp(0, 255); pl = torch.round(e * 16384)
        l = l * alpha + beta * (pl.sum(-1) / 16384)
        acc = acc * alpha[..., None] + beta[..., None] * torch.matmul(p8.double(), v8[:, j0:j0+128].double()).float()
        m = mn
    return (acc * sv[:, None, :] / l[..., None]).to(torch.bfloat16).float()
for i,(name, Mq, Mk, H, D, ko, kc, qo, qc) in enumerate([("gauss_2048", 64, 2048, 2, 128, 0.0, 0, 0.0, 0),("k4x10_2048", 64, 2048, 2, 128, 10.0, 4, 0.0, 0),("k4x20_2048", 64, 2048, 2, 128, 20.0, 4, 0.0, 0),("k4x15_q4x8_2048", 64, 2048, 2, 128, 15.0, 4, 8.0, 4),("k16x12_2048", 64, 2048, 2, 128, 12.0, 16, 0.0, 0),("k4x15_q4x8_1000", 64, 1000, 2, 128, 15.0, 4, 8.0, 4)]):
    cs = 1000 + 16 * i
    q = fidelity_tensor(cs, Mq, H, D, qo, qc).float().transpose(0,1)
    k = fidelity_tensor(cs+1, Mk, H, D, ko, kc).float().transpose(0,1)
    v = fidelity_tensor(cs+2, Mk, H, D, 0, 0).float().transpose(0,1)
    ex = exact_attention(q,k,v)
    ki = rel_l2(kitchen_int8_attention(q,k,v), ex)
    a, b = rel_l2(ours(q,k,v,False), ex), rel_l2(ours(q,k,v,True), ex)
    print(f"{name:18s} kitchen {ki:.3e}  ours~(running) {a:.3e} ({a/ki:.2f})  ours~(tile P) {b:.3e} ({b/ki:.2f})")
