"""Narrow-phase objects made per collision pair on the pair's first test, not for every pair.

A ``pinocchio.GeometryData`` holds, for every collision pair registered in its GeometryModel,
a collision request and result, a contact-patch request and result and the coal functors
(about 5.5 kB a pair): for N bodies that is N^2 / 2 pairs, 2.7 GB for 1,000 boxes, although
the broad phase passes only pairs in reach to the narrow phase. :class:`NarrowPhase` keeps the
same coal objects (``coal.ComputeCollision`` / ``coal.ComputeContactPatch`` on the two geoms'
shapes, the requests pinocchio's GeometryData makes, with ``enable_contact`` and the driver's
GJK/EPA tolerances) in a dict filled on a pair's first narrow-phase test and does what
``pinocchio.computeCollision`` / ``computeContactPatch`` do with them at the placements in
``gdata.oMg`` (each geom's transform read once per :meth:`new_placements`). A scene with more than :data:`REGISTER_PAIRS_MAX` candidate pairs does not
register them in its GeometryModel (``SimModel.pairs`` lists them), so its GeometryData
carries no per-pair tables.
"""
from __future__ import annotations

import warnings

import coal
import numpy as np
import pinocchio as pin

# candidate pairs registered in the pinocchio GeometryModel at most (about 11 MB of
# GeometryData); scenes with more keep them only in SimModel.pairs
REGISTER_PAIRS_MAX = 2000


def _tf(M: pin.SE3) -> coal.Transform3s:
    return coal.Transform3s(M.rotation, M.translation)


class NarrowPhase:
    """Per-pair coal requests, results and functors, made on first use (module docstring)."""

    def __init__(self, geom_model: pin.GeometryModel, pairs: np.ndarray, tolerance: float):
        self.gm = geom_model
        self.pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        self.tolerance = float(tolerance)
        self._slots: dict = {}
        self._tfs: dict = {}         # geom -> coal transform at the current placements

    def new_placements(self) -> None:
        """Forget the transforms read from gdata.oMg (call whenever the placements change)."""
        self._tfs.clear()

    def _tf(self, gdata: pin.GeometryData, g: int) -> coal.Transform3s:
        t = self._tfs.get(g)
        if t is None:
            t = self._tfs[g] = _tf(gdata.oMg[g])
        return t

    def __len__(self) -> int:
        return len(self._slots)

    def slot(self, k: int):
        """(collision request, collision result, contact-patch result) of pair k."""
        s = self._slots.get(k)
        if s is None:
            a, b = (int(x) for x in self.pairs[k])
            objs = self.gm.geometryObjects
            # the requests pinocchio's GeometryData makes (no cost-related request, one contact),
            # with contacts enabled and the driver's tolerances
            req = coal.CollisionRequest(coal.CollisionRequestFlag.NO_REQUEST, 1)
            req.enable_contact = True
            with warnings.catch_warnings():      # (deprecated in coal, set by pinocchio)
                warnings.simplefilter("ignore", DeprecationWarning)
                req.enable_cached_gjk_guess = True
            req.gjk_tolerance = self.tolerance
            req.epa_tolerance = self.tolerance
            preq = coal.ContactPatchRequest()
            s = self._slots[k] = (req, coal.CollisionResult(), coal.ContactPatchResult(preq),
                                  preq, coal.ComputeCollision(objs[a].geometry, objs[b].geometry),
                                  coal.ComputeContactPatch(objs[a].geometry, objs[b].geometry),
                                  a, b)
        return s[0], s[1], s[2]

    def collide(self, k: int, gdata: pin.GeometryData) -> bool:
        """pinocchio.computeCollision for pair k at gdata.oMg: clears and fills its result."""
        req, res, _, _, cc, _, a, b = self._slots[k]
        req.distance_upper_bound = req.security_margin + 1e-6      # (as pinocchio does)
        res.clear()
        cc(self._tf(gdata, a), self._tf(gdata, b), req, res)
        return res.isCollision()

    def patch(self, k: int, gdata: pin.GeometryData) -> None:
        """pinocchio.computeContactPatch for pair k (after collide) at gdata.oMg."""
        _, res, pres, preq, _, cp, a, b = self._slots[k]
        cp(self._tf(gdata, a), self._tf(gdata, b), res, preq, pres)

    def patch_along(self, k: int, gdata: pin.GeometryData, n: np.ndarray) -> None:
        """The contact patch of pair k (after collide) recomputed about the normal n instead of
        coal's: the support sets along n, projected along n (coal's patch solver reads the
        normal of the result's contact; the result keeps n)."""
        _, res, pres, preq, _, cp, a, b = self._slots[k]
        ct = res.getContact(0)              # (a copy)
        ct.normal = np.asarray(n, dtype=float)
        res.clear()
        res.addContact(ct)
        cp(self._tf(gdata, a), self._tf(gdata, b), res, preq, pres)

    # indexable columns, as a GeometryData's per-pair vectors: requests[k], results[k], ...
    @property
    def requests(self) -> "_Column":
        return _Column(self, 0)

    @property
    def results(self) -> "_Column":
        return _Column(self, 1)

    @property
    def patch_results(self) -> "_Column":
        return _Column(self, 2)


class _Column:
    __slots__ = ("owner", "i")

    def __init__(self, owner: NarrowPhase, i: int):
        self.owner, self.i = owner, i

    def __getitem__(self, k: int):
        return self.owner.slot(int(k))[self.i]


def candidate_pairs(geoms, bodies, weld_parent: dict, excluded: set) -> list[tuple[int, int]]:
    """MJCF's candidate geom pairs ``(i, k)``, ``i < k`` in order, filtered as MuJoCo does:
    geoms of different welded bodies (``bodies[g.body].weld``), compatible ``contype`` /
    ``conaffinity`` bits (``contype_i & conaffinity_k or contype_k & conaffinity_i``), not two
    planes, not a body and its parent weld (neither the world), not an ``<exclude>``d body pair
    (``excluded``: frozensets of body names). One numpy pass per geom over the geoms after it
    (no Python loop over the N^2 / 2 pairs)."""
    n = len(geoms)
    if n < 2:
        return []
    welds = {w: i for i, w in enumerate(sorted({bodies[g.body].weld for g in geoms}
                                               | set(weld_parent) | set(weld_parent.values())))}
    names = {b: i for i, b in enumerate(sorted({g.body for g in geoms}
                                               | {b for e in excluded for b in e}))}
    weld = np.array([welds[bodies[g.body].weld] for g in geoms], dtype=np.int64)
    body = np.array([names[g.body] for g in geoms], dtype=np.int64)
    ctype = np.array([int(g.contype) for g in geoms], dtype=np.int64)
    caff = np.array([int(g.conaffinity) for g in geoms], dtype=np.int64)
    plane = np.array([g.kind == "plane" for g in geoms], dtype=bool)
    wpar = np.full(len(welds), -1, dtype=np.int64)
    for w, p in weld_parent.items():
        wpar[welds[w]] = welds[p]
    world = welds.get("world", -2)
    nb = len(names)
    ex = np.array(sorted({names[a] * nb + names[b] for e in excluded
                          for a, b in ((min(e), max(e)), (max(e), min(e)))}), dtype=np.int64)
    out = []
    for i in range(n - 1):
        k = np.arange(i + 1, n)
        wi, wk = weld[i], weld[k]
        ok = (wk != wi) & (((ctype[i] & caff[k]) | (ctype[k] & caff[i])) != 0) \
            & ~(plane[i] & plane[k]) \
            & ~((wi != world) & (wk != world) & ((wpar[wi] == wk) | (wpar[wk] == wi)))
        if len(ex):
            ok &= ~np.isin(body[i] * nb + body[k], ex)
        ks = k[ok].tolist()
        if ks:
            out.extend(zip([i] * len(ks), ks))
    return out
