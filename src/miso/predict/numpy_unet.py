"""Numpy inference of an ensemble of :class:`miso.predict.model.UNet` (batch norm folded).

All members are evaluated at once with stacked weights, so one mix of the whole ensemble costs a
few dozen small numpy operations (well under a millisecond) and inference needs no torch.
"""

from __future__ import annotations

import numpy as np

_BLOCKS = ("enc1", "enc2", "centre", "dec2", "dec1")
_EPS = 1e-5


def _fold(sd: dict[str, np.ndarray], prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Conv (no bias) + BatchNorm (eval) -> conv weight and bias."""
    w = sd[f"{prefix[0]}.weight"]
    g, b = sd[f"{prefix[1]}.weight"], sd[f"{prefix[1]}.bias"]
    mu, var = sd[f"{prefix[1]}.running_mean"], sd[f"{prefix[1]}.running_var"]
    scale = g / np.sqrt(var + _EPS)
    return w * scale[:, None, None, None], b - mu * scale


class NumpyEnsemble:
    """Stacked, folded weights of K U-Nets; ``__call__`` maps (B, 3, 7) -> (K, B, 3, 7)."""

    def __init__(self, state_dicts: list[dict[str, np.ndarray]]) -> None:
        self.k = len(state_dicts)
        self.p: dict[str, np.ndarray] = {}
        for blk in _BLOCKS:
            for i, (conv, bn) in enumerate(((0, 1), (3, 4))):
                ws, bs = zip(
                    *(_fold(sd, (f"{blk}.{conv}", f"{blk}.{bn}")) for sd in state_dicts),
                    strict=True,
                )
                # (K, O, C, a, b) -> (K, a, b, C, O) -> (K, 4C, O), matching the patch order
                wst = np.stack(ws).transpose(0, 3, 4, 2, 1)
                self.p[f"{blk}.{i}.w"] = wst.reshape(self.k, -1, wst.shape[-1]).astype(np.float64)
                self.p[f"{blk}.{i}.b"] = np.stack(bs).astype(np.float64)
        for name in ("up2", "up1", "out"):
            w = np.stack([sd[f"{name}.weight"] for sd in state_dicts]).astype(np.float64)
            if name != "out":  # (K, Cin, Cout, a, b) -> (K, Cin, a, b, Cout) -> (K, Cin, 4Cout)
                w = w.transpose(0, 1, 3, 4, 2).reshape(self.k, w.shape[1], -1)
            self.p[f"{name}.w"] = w
            self.p[f"{name}.b"] = np.stack([sd[f"{name}.bias"] for sd in state_dicts]).astype(
                np.float64
            )

    @staticmethod
    def _conv2(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        # x (K, B, H, W, C) channels-last; w (K, 4C, O). PyTorch 'same' with an even kernel pads
        # one zero at the bottom/right.
        k, bb, h, wd, _ = x.shape
        xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1), (0, 0)))
        patches = np.concatenate(
            [xp[:, :, a : a + h, c : c + wd, :] for a in (0, 1) for c in (0, 1)], axis=-1
        )
        y = np.matmul(patches.reshape(k, bb * h * wd, -1), w) + b[:, None, :]
        return np.maximum(y, 0.0).reshape(k, bb, h, wd, -1)

    def _block(self, x: np.ndarray, blk: str) -> np.ndarray:
        x = self._conv2(x, self.p[f"{blk}.0.w"], self.p[f"{blk}.0.b"])
        return self._conv2(x, self.p[f"{blk}.1.w"], self.p[f"{blk}.1.b"])

    @staticmethod
    def _pool(x: np.ndarray) -> np.ndarray:
        k, b, h, w, c = x.shape
        return x.reshape(k, b, h // 2, 2, w // 2, 2, c).max(axis=(3, 5))

    @staticmethod
    def _up(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        # ConvTranspose2d(kernel 2, stride 2); w (K, Cin, 4*Cout) in (a, b, o) order.
        k, bb, h, wd, cin = x.shape
        cout = w.shape[2] // 4
        y = np.matmul(x.reshape(k, -1, cin), w).reshape(k, bb, h, wd, 2, 2, cout)
        y = y.transpose(0, 1, 2, 4, 3, 5, 6).reshape(k, bb, 2 * h, 2 * wd, cout)
        return y + b[:, None, None, None, :]

    def __call__(self, mps: np.ndarray) -> np.ndarray:
        x = np.asarray(mps, dtype=np.float64)
        z = np.zeros((self.k, x.shape[0], 4, 8, 1))
        z[:, :, :3, :7, 0] = x
        c1 = self._block(z, "enc1")
        c2 = self._block(self._pool(c1), "enc2")
        c = self._block(self._pool(c2), "centre")
        d2 = self._block(
            np.concatenate([self._up(c, self.p["up2.w"], self.p["up2.b"]), c2], axis=-1), "dec2"
        )
        d1 = self._block(
            np.concatenate([self._up(d2, self.p["up1.w"], self.p["up1.b"]), c1], axis=-1), "dec1"
        )
        wo = self.p["out.w"][:, 0, :, 0, 0]  # K, C
        k, b, h, w, c = d1.shape
        out = np.matmul(d1.reshape(k, -1, c), wo[:, :, None]).reshape(k, b, h, w)
        return out[:, :, :3, :7] + self.p["out.b"][:, 0, None, None, None]
