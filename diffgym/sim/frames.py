"""Contact frames: orthonormal (t1, t2, n) bases of contact normals."""
from __future__ import annotations

import numpy as np

_I1 = np.array([1, 2, 0])
_I2 = np.array([2, 0, 1])
# helper x n for helper = e_x and e_y as matrices acting on n: (0, -n_z, n_y) and (n_z, 0, -n_x)
_HELPER_CROSS = np.array([[[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]],     # e_y x n
                          [[0.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]]])    # e_x x n


def _row_norms(x: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(x, axis=1, keepdims=True)`` without its Python overhead (same numbers)."""
    return np.sqrt(np.add.reduce(x * x, axis=1, keepdims=True))


def tangent_frames(normals: np.ndarray) -> np.ndarray:
    """Orthonormal frames (k, 3, 3) whose third column is the normal."""
    n = normals / _row_norms(normals)
    # t1 = helper x n, helper = e_x where |n_x| < 0.9, else e_y (the matrices pick and negate
    # components of n, so this is exact)
    t1 = np.einsum("kij,kj->ki", _HELPER_CROSS[(np.abs(n[:, 0]) < 0.9).view(np.int8)], n)
    t1 /= _row_norms(t1)
    out = np.empty((len(n), 3, 3))
    out[:, :, 0] = t1
    out[:, :, 1] = n[:, _I1] * t1[:, _I2] - n[:, _I2] * t1[:, _I1]      # n x t1, as np.cross
    out[:, :, 2] = n
    return out
