"""The README's Python example: attn.attention on NumPy arrays, then the PyTorch drop-in for
scaled_dot_product_attention with a backward pass."""

import numpy as np
import torch

import attn
import attn.torch

# q [1, 4, 3, 2]: 4 query heads; k, v [1, 2, 3, 2]: 2 key/value heads (grouped-query)
q = np.arange(24, dtype=np.float32).reshape(1, 4, 3, 2) / 10
k = np.arange(12, dtype=np.float32).reshape(1, 2, 3, 2) / 10
v = np.arange(12, dtype=np.float32).reshape(1, 2, 3, 2)
out = attn.attention(q, k, v, is_causal=True)
print(f"attn {attn.__version__}: out {list(out.shape)} {out.dtype}")
for i, row in enumerate(out[0, 3]):
    print(f"  head 3, row {i}: " + " ".join(f"{x:.4f}" for x in row))

qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
o = attn.torch.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
o.sum().backward()
ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
print(f"torch drop-in: max |attn - torch| = {float((o - ref).abs().max().detach()):.1e}, "
      f"dv[0, 1] = {[round(x, 4) for x in vt.grad[0, 1, 0].tolist()]}")
