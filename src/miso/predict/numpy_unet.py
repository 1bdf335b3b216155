"""Numpy inference of an ensemble of :class:`miso.predict.model.UNet` (batch norm folded).

All members are evaluated at once with stacked float32 weights. Activations are kept flat and
channels-last, ``(K, B*H*W, C)``; a 2x2 'same' convolution is one precomputed index gather
(im2col, out-of-image taps read an all-zero row) plus one batched matmul, so one mix through the
whole ensemble is ~40 small numpy calls and no per-call padding (well under a millisecond).
"""

from __future__ import annotations

import numpy as np

_BLOCKS = ("enc1", "enc2", "centre", "dec2", "dec1")
_EPS = 1e-5
#: image size per level: the (3, 7) input is zero-padded to 4x8, then pooled twice.
_LEVELS = ((4, 8), (2, 4), (1, 2))
_DT = np.float32


def _fold(sd: dict[str, np.ndarray], prefix: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Conv (no bias) + BatchNorm (eval) -> conv weight and bias."""
    w = np.asarray(sd[f"{prefix[0]}.weight"], dtype=np.float64)
    g, b = sd[f"{prefix[1]}.weight"], sd[f"{prefix[1]}.bias"]
    mu, var = sd[f"{prefix[1]}.running_mean"], sd[f"{prefix[1]}.running_var"]
    scale = np.asarray(g, dtype=np.float64) / np.sqrt(np.asarray(var, dtype=np.float64) + _EPS)
    return w * scale[:, None, None, None], b - mu * scale


def _im2col_index(b: int, h: int, w: int) -> np.ndarray:
    """Flat row indices (B*H*W*4,) of the 2x2 taps (0,0),(0,1),(1,0),(1,1) of every pixel.

    PyTorch 'same' padding with an even kernel pads one zero at the bottom/right; such taps
    point at row ``B*H*W`` (the zero row appended to the activations).
    """
    zero = b * h * w
    idx = np.full((b, h, w, 4), zero, dtype=np.intp)
    base = np.arange(b * h * w).reshape(b, h, w)
    for t, (di, dj) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        idx[:, : h - di, : w - dj, t] = base[:, di:, dj:]
    return idx.reshape(-1)


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
                # (K, O, C, a, b) -> (K, a, b, C, O) -> (K, 4C, O), matching the tap order
                wst = np.stack(ws).transpose(0, 3, 4, 2, 1)
                self.p[f"{blk}.{i}.w"] = np.ascontiguousarray(
                    wst.reshape(self.k, -1, wst.shape[-1]), dtype=_DT
                )
                self.p[f"{blk}.{i}.b"] = np.stack(bs)[:, None, :].astype(_DT)
        for name in ("up2", "up1"):  # (K, Cin, Cout, a, b) -> (K, Cin, a, b, Cout) -> (K, Cin, 4Co)
            w = np.stack([sd[f"{name}.weight"] for sd in state_dicts]).astype(np.float64)
            self.p[f"{name}.w"] = np.ascontiguousarray(
                w.transpose(0, 1, 3, 4, 2).reshape(self.k, w.shape[1], -1), dtype=_DT
            )
            b = np.stack([sd[f"{name}.bias"] for sd in state_dicts]).astype(np.float64)
            self.p[f"{name}.b"] = np.tile(b, (1, 4))[:, None, :].astype(_DT)  # (K, 1, 4Cout)
        self.p["out.w"] = np.stack([sd["out.weight"][0, :, 0, 0] for sd in state_dicts]).astype(
            _DT
        )[:, :, None]  # (K, C, 1)
        self.p["out.b"] = np.stack([sd["out.bias"] for sd in state_dicts]).astype(_DT)[
            :, None, :
        ]  # (K, 1, 1)
        self._cache: dict[int, tuple] = {}

    def _plan(self, b: int) -> tuple:
        """Per-batch-size constants: gather indices per level and zero rows (cached)."""
        plan = self._cache.get(b)
        if plan is None:
            idx = tuple(_im2col_index(b, h, w) for h, w in _LEVELS)
            plan = (idx, np.zeros((self.k, b, 4, 8), dtype=_DT))
            if len(self._cache) > 16:
                self._cache.clear()
            self._cache[b] = plan
        return plan

    @staticmethod
    def _conv(x: np.ndarray, idx: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """x (K, P, C) flat channels-last -> relu(conv2x2(x)) (K, P, O)."""
        k, p, c = x.shape
        xz = np.concatenate((x, np.zeros((k, 1, c), dtype=x.dtype)), axis=1)
        y = np.matmul(xz[:, idx].reshape(k, p, 4 * c), w)
        y += b
        return np.maximum(y, 0.0, out=y)

    def _block(self, x: np.ndarray, idx: np.ndarray, blk: str) -> np.ndarray:
        p = self.p
        x = self._conv(x, idx, p[f"{blk}.0.w"], p[f"{blk}.0.b"])
        return self._conv(x, idx, p[f"{blk}.1.w"], p[f"{blk}.1.b"])

    @staticmethod
    def _pool(x: np.ndarray, bb: int, h: int, w: int) -> np.ndarray:
        k, _, c = x.shape
        y = x.reshape(k, bb, h // 2, 2, w // 2, 2, c).max(axis=(3, 5))
        return y.reshape(k, -1, c)

    @staticmethod
    def _up(x: np.ndarray, w: np.ndarray, b: np.ndarray, bb: int, h: int, wd: int) -> np.ndarray:
        """ConvTranspose2d(kernel 2, stride 2): (K, B*h*wd, Cin) -> (K, B*2h*2wd, Cout)."""
        k = x.shape[0]
        y = np.matmul(x, w)
        y += b
        cout = w.shape[2] // 4
        y = y.reshape(k, bb, h, wd, 2, 2, cout).transpose(0, 1, 2, 4, 3, 5, 6)
        return y.reshape(k, bb * 4 * h * wd, cout)

    def __call__(self, mps: np.ndarray) -> np.ndarray:
        x = np.asarray(mps, dtype=_DT)
        bb = x.shape[0]
        (i1, i2, i3), z0 = self._plan(bb)
        z = z0.copy()
        z[:, :, :3, :7] = x
        p = self.p
        (h1, w1), (h2, w2), (h3, w3) = _LEVELS
        c1 = self._block(z.reshape(self.k, -1, 1), i1, "enc1")
        c2 = self._block(self._pool(c1, bb, h1, w1), i2, "enc2")
        c = self._block(self._pool(c2, bb, h2, w2), i3, "centre")
        u2 = self._up(c, p["up2.w"], p["up2.b"], bb, h3, w3)
        d2 = self._block(np.concatenate((u2, c2), axis=-1), i2, "dec2")
        u1 = self._up(d2, p["up1.w"], p["up1.b"], bb, h2, w2)
        d1 = self._block(np.concatenate((u1, c1), axis=-1), i1, "dec1")
        out = np.matmul(d1, p["out.w"])  # (K, B*32, 1)
        out += p["out.b"]
        return out.reshape(self.k, bb, h1, w1)[:, :, :3, :7]
