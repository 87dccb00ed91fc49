"""Stage 2: a class-conditional gated PixelCNN prior over the VQ-VAE's code grid.

Gated PixelCNN (van den Oord et al. 2016, "Conditional image generation with PixelCNN decoders"),
the prior of the ev-softmax paper's Sec. 4.3 (via ritheshkumar95/pytorch-vqvae): a vertical stack
(k//2+1 x k kernels: the rows above) and a horizontal stack (1 x k//2+1 kernels: the pixels to the
left) with gated activations ``tanh(a + c_y) * sigmoid(b + c_y)``, the class embedding ``c_y``
added to both; the vertical stack feeds the horizontal one through a 1x1 convolution; residual
connections on the horizontal stack. As in that code, the first layer has 7x7 kernels and the
others 3x3. The first layer's masks are of type A (the current position is
hidden from both stacks); later layers are type B. So the output at (i, j) depends only on the
codes before (i, j) in raster order, and on a row-cropped input ``codes[:, :i+1]`` it is the same
(the sampler uses this to skip the rows below).

The output head: ReLU(1x1 convolution) to ``hidden`` features, then the last 1x1 convolution to the
K code scores, written as an ``nn.Linear`` over the channels (a 1x1 convolution is a linear layer per
position) so that post-hoc evidential sparsification can read its weights
(``registry.Normalizer.probs_from_linear``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GatedMaskedConv(nn.Module):
    def __init__(self, dim: int, kernel: int, n_classes: int, mask_a: bool, residual: bool) -> None:
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd, got {kernel}")
        self.residual = residual
        self.class_embedding = nn.Embedding(n_classes, 2 * dim)
        self.vertical = nn.Conv2d(dim, 2 * dim, (kernel // 2 + 1, kernel), padding=(kernel // 2, kernel // 2))
        self.vertical_to_horizontal = nn.Conv2d(2 * dim, 2 * dim, 1)
        self.horizontal = nn.Conv2d(dim, 2 * dim, (1, kernel // 2 + 1), padding=(0, kernel // 2))
        self.horizontal_out = nn.Conv2d(dim, dim, 1)
        v_mask = torch.ones_like(self.vertical.weight)
        h_mask = torch.ones_like(self.horizontal.weight)
        if mask_a:  # hide the current row from the vertical stack and the current pixel from the horizontal one
            v_mask[:, :, -1] = 0
            h_mask[:, :, :, -1] = 0
        self.register_buffer("v_mask", v_mask)
        self.register_buffer("h_mask", h_mask)

    @staticmethod
    def _gate(x: Tensor) -> Tensor:
        a, b = x.chunk(2, dim=1)
        return torch.tanh(a) * torch.sigmoid(b)

    def forward(self, v: Tensor, h: Tensor, y: Tensor):
        height, width = v.shape[-2:]
        cond = self.class_embedding(y)[:, :, None, None]
        v_pre = F.conv2d(v, self.vertical.weight * self.v_mask, self.vertical.bias,
                         padding=self.vertical.padding)[:, :, :height]  # keep rows <= i: the rows above (and i)
        h_pre = F.conv2d(h, self.horizontal.weight * self.h_mask, self.horizontal.bias,
                         padding=self.horizontal.padding)[:, :, :, :width]  # keep columns <= j
        v_out = self._gate(v_pre + cond)
        h_gated = self._gate(self.vertical_to_horizontal(v_pre) + h_pre + cond)
        h_out = self.horizontal_out(h_gated)
        return v_out, (h_out + h if self.residual else h_out)


class GatedPixelCNN(nn.Module):
    """Class-conditional prior ``p(code_{ij} | codes before (i, j), class)`` over a K-code grid."""

    def __init__(self, n_codes: int, n_classes: int, dim: int = 128, layers: int = 10, first_kernel: int = 7,
                 kernel: int = 3, hidden: int | None = None) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.embedding = nn.Embedding(n_codes, dim)
        self.layers = nn.ModuleList(
            GatedMaskedConv(dim, first_kernel if i == 0 else kernel, n_classes, mask_a=(i == 0), residual=(i > 0))
            for i in range(layers))
        self.features = nn.Sequential(nn.Conv2d(dim, hidden or dim, 1), nn.ReLU())
        self.out = nn.Linear(hidden or dim, n_codes)
        """The last layer: code scores = ``out(features)`` at every position."""

    def feature_map(self, codes: Tensor, y: Tensor) -> Tensor:
        """Features before the last layer, ``(N, H, W, hidden)``, of a code grid ``(N, H, W)``."""
        x = self.embedding(codes).permute(0, 3, 1, 2)
        v = h = x
        for layer in self.layers:
            v, h = layer(v, h, y)
        return self.features(h).permute(0, 2, 3, 1)

    def forward(self, codes: Tensor, y: Tensor) -> Tensor:
        """Code scores ``(N, H, W, K)``."""
        return self.out(self.feature_map(codes, y))
