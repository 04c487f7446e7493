"""The simulator pipeline, one module per stage (the package root re-exports its public names:
``diffgym.Simulator``, ``SimModel``, ``ModelError``, ``SimulationError``, the gradient modes).

* model loading: ``model`` (SimModel, load checks), ``mjcf``, ``urdf``, ``xmlsource``
  (``<include>``), ``unsupported`` (what is refused by name), ``trees`` (one small pinocchio
  Model/Data per group of independent kinematic trees);
* collision: ``collision_driver`` (broad and narrow phase, contact patches), ``pair_tables``
  (coal's per-pair objects, made on first use), ``collision_kernels``, ``plane_contacts``,
  ``convex_support`` (exact witness points of smooth convex pairs), and their derivatives
  ``collision_derivatives``;
* constraint assembly: ``constraint`` (contact frames, joint limits, islands), ``equality``
  and ``equality_kernels`` (equality, dry-friction, tendon and cone-limit rows);
* the NCP solve: ``solver`` (the stages; Python reference), ``solver_kernels`` (compiled);
* the step: ``forward`` (``Simulator``), ``impact_time`` (restitution at the time of impact);
* derivatives: ``derivatives``, ``derivative_kernels``; gradient modes: ``gradient_modes``,
  ``smoothing``, ``smoothing_kernels``, ``long_range``, ``long_range_kernels``;
* shared helpers: ``frames``, ``pinviews``, ``jit`` (numba with a per-kernel cache;
  ``DIFFGYM_JIT=0`` runs every kernel as plain Python).
"""
