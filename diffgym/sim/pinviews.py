"""Zero-copy numpy views of pinocchio's per-joint arrays (placements, velocities, forces).

Reading ``data.oMi[j]`` from Python builds an SE3 object per joint (~0.5 us each); compiled
kernels instead read the std::vector's memory through a view made once per ``pinocchio.Data``.
A view is only handed out after checking that it shows what pinocchio's own accessors return
(the vector's elements are equally spaced, rotation stored column-major and followed by the
translation); where that fails, callers gather copies joint by joint. The view aliases the Data's memory: keep the Data alive as long as the view (the
callers store both together), and never resize the vector.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pinocchio as pin


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def raw_rows(addrs: list[int], width: int) -> np.ndarray | None:
    """A (len(addrs), width) float64 view of the memory at addrs (equally spaced rows of width
    doubles, e.g. the elements of a pinocchio std::vector), or None where they are not."""
    n = len(addrs)
    if n == 0:
        return None
    stride = addrs[1] - addrs[0] if n > 1 else 8 * width
    if stride < 8 * width or stride % 8 or any(a != addrs[0] + i * stride
                                               for i, a in enumerate(addrs)):
        return None
    size = stride * (n - 1) + 8 * width
    buf = (ctypes.c_char * size).from_address(addrs[0])
    return np.ndarray((n, width), dtype=np.float64, buffer=buf, strides=(stride, 8))


def gather_placements(data: pin.Data, out: np.ndarray) -> np.ndarray:
    """Copy data.oMi into out (njoints, 12): rotation column-major, then translation."""
    for j, M in enumerate(data.oMi):
        out[j, :9] = M.rotation.ravel(order="F")
        out[j, 9:] = M.translation
    return out


def placement_view(model: pin.Model, data: pin.Data) -> np.ndarray | None:
    """A checked (njoints, 12) view of ``data.oMi`` (rotation column-major, translation), or
    None. The check reads the layout (equally spaced elements, a column-major rotation directly
    followed by the translation) and compares the view with the accessors at data's current
    placements; it does not change data."""
    nj = model.njoints
    oMi = data.oMi
    for j in range(nj):
        R, t = oMi[j].rotation, oMi[j].translation
        if (R.strides != (8, 24) or t.strides != (8,) or addr(t) != addr(R) + 72
                or R.dtype != np.float64 or t.dtype != np.float64):
            return None
    oM = raw_rows([addr(oMi[j].rotation) for j in range(nj)], 12)
    if oM is None or not np.array_equal(oM, gather_placements(data, np.empty((nj, 12)))):
        return None
    return oM
