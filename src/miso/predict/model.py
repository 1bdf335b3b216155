"""The MISO-shaped U-Net: (3 MPS levels x 7 jobs) -> (3 MIG slices x 7 jobs)."""

from __future__ import annotations

import torch
from torch import nn


def _block(c_in: int, c_out: int) -> nn.Sequential:
    """Two 2x2 'same' convolutions, each followed by batch norm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=2, padding="same", bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, kernel_size=2, padding="same", bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """Input (B, 3, 7) is zero-padded to a 1-channel 4x8 image, output cropped back to (B, 3, 7).

    Encoder 4x8 -> 2x4 -> centre 1x2, decoder with transposed convolutions and skip connections,
    1x1 output convolution. ``width`` is the channel count of the first level (doubling per level).
    """

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        w = width
        self.width = width
        self.enc1 = _block(1, w)
        self.enc2 = _block(w, 2 * w)
        self.pool = nn.MaxPool2d(2)
        self.centre = _block(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, kernel_size=2, stride=2)
        self.dec2 = _block(4 * w, 2 * w)
        self.up1 = nn.ConvTranspose2d(2 * w, w, kernel_size=2, stride=2)
        self.dec1 = _block(2 * w, w)
        self.out = nn.Conv2d(w, 1, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = nn.functional.pad(x.unsqueeze(1), (0, 1, 0, 1))  # (B, 1, 4, 8)
        c1 = self.enc1(z)
        c2 = self.enc2(self.pool(c1))
        c = self.centre(self.pool(c2))
        d2 = self.dec2(torch.cat([self.up2(c), c2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), c1], dim=1))
        return self.out(d1)[:, 0, :3, :7]
