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


def _gblock(k: int, c_in: int, c_out: int) -> nn.Sequential:
    """:func:`_block` for K independent members at once (grouped convolutions)."""
    return nn.Sequential(
        nn.Conv2d(k * c_in, k * c_out, kernel_size=2, padding="same", bias=False, groups=k),
        nn.BatchNorm2d(k * c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(k * c_out, k * c_out, kernel_size=2, padding="same", bias=False, groups=k),
        nn.BatchNorm2d(k * c_out),
        nn.ReLU(inplace=True),
    )


class EnsembleUNet(nn.Module):
    """K independent :class:`UNet` members in one module (grouped convolutions).

    Input (B, K, 3, 7): member k sees ``x[:, k]`` (its own sample stream); output (B, K, 3, 7).
    Training all members in one forward/backward pass costs about as much wall time as one member
    on a CPU (the tiny layers are overhead-bound). :meth:`member_state_dicts` splits the weights
    into K ordinary :class:`UNet` state dicts (what the numpy inference and the weight file use).
    """

    def __init__(self, width: int = 32, k: int = 4) -> None:
        super().__init__()
        w = width
        self.width, self.k = width, k
        self.enc1 = _gblock(k, 1, w)
        self.enc2 = _gblock(k, w, 2 * w)
        self.pool = nn.MaxPool2d(2)
        self.centre = _gblock(k, 2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(k * 4 * w, k * 2 * w, kernel_size=2, stride=2, groups=k)
        self.dec2 = _gblock(k, 4 * w, 2 * w)
        self.up1 = nn.ConvTranspose2d(k * 2 * w, k * w, kernel_size=2, stride=2, groups=k)
        self.dec1 = _gblock(k, 2 * w, w)
        self.out = nn.Conv2d(k * w, k, kernel_size=1, groups=k)

    def _cat(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Per-member channel concatenation [a_k, b_k] (what each UNet's torch.cat does)."""
        n, _, h, w = a.shape
        return torch.cat(
            [a.view(n, self.k, -1, h, w), b.view(n, self.k, -1, h, w)], dim=2
        ).view(n, -1, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = nn.functional.pad(x, (0, 1, 0, 1))  # (B, K, 4, 8)
        c1 = self.enc1(z)
        c2 = self.enc2(self.pool(c1))
        c = self.centre(self.pool(c2))
        d2 = self.dec2(self._cat(self.up2(c), c2))
        d1 = self.dec1(self._cat(self.up1(d2), c1))
        return self.out(d1)[:, :, :3, :7]

    def member_state_dicts(self) -> list[dict[str, torch.Tensor]]:
        """Split into K :class:`UNet` state dicts (grouped tensors sliced along dim 0)."""
        out: list[dict[str, torch.Tensor]] = [{} for _ in range(self.k)]
        for name, t in self.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            n = t.shape[0] // self.k
            for i in range(self.k):
                out[i][name] = t[i * n : (i + 1) * n].clone()
        return out
