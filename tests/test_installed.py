"""The artifact users get: the wheel, installed outside the checkout, used from another directory.

The module builds the wheel from (a copy of) this checkout, installs it (without dependencies)
into a fresh virtual environment in a temporary directory, and makes the project's ``.venv`` packages (the
dependencies) visible to it through a ``.pth`` file that skips the editable install of the
checkout, so the only diffgym importable there is the installed one. From a temporary working
directory it then runs what a new user runs: the README's Python snippets (read from README.md),
``gym.make`` of every id after ``import diffgym`` alone, stable-baselines3 on an id string,
``diffgym record``, ``diffgym train`` of a shipped config by name and ``diffgym sweep
smoke.yaml``. A read-only installation with no writable HOME still imports and steps (kernels
compiled from scratch in memory, one line saying so, and the first-use announcement checked).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IDS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]


def _run(cmd, *, env, cwd, timeout=1800, check=True):
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {out.returncode}\n"
                             f"--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-6000:]}")
    return out


@pytest.fixture(scope="module")
def installed():
    """(python, bin dir, env, workdir, site-packages) of a fresh install of the built wheel."""
    import hashlib
    import tempfile
    # one directory per checkout (concurrent checkouts do not collide); everything in it is
    # made afresh except the kernel cache, which later runs reuse while the sources are unchanged
    tag = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    base = Path(tempfile.gettempdir()) / f"diffgym-installed-{os.getuid()}-{tag}"
    base.mkdir(exist_ok=True)
    os.chmod(base, 0o755)                        # (readable by the unprivileged user below)

    def clean():
        for p in base.iterdir():
            if p.name != "numba-cache":
                subprocess.run(["chmod", "-R", "u+w", str(p)], check=False)
                shutil.rmtree(p, ignore_errors=True)
    clean()
    try:
        yield _install(base)
    finally:
        clean()


def _install(base: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    # 1. the wheel, built by pip (with this environment's setuptools when it is recent enough:
    # offline and faster; otherwise in an isolated build environment from the registry)
    dist = base / "dist"
    try:
        import setuptools
        isolation = [] if int(setuptools.__version__.split(".")[0]) < 77 else ["--no-build-isolation"]
    except ImportError:
        isolation = []
    # (from a copy of the sources: nothing is written into the checkout, no stale build/ files)
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(dist), str(src)],
         env=env, cwd=base)
    (wheel,) = dist.glob("diffgym-*.whl")
    # the kernel cache is reused only by a wheel with the same Python sources: numba keys a
    # cached kernel on its own file alone, not on the kernels it calls from other files
    import hashlib
    digest = hashlib.sha1()
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.endswith(".py"):
                digest.update(name.encode() + z.read(name))
    caches = base / "numba-cache"
    caches.mkdir(exist_ok=True)
    for old in caches.iterdir():
        if old.name != digest.hexdigest():
            shutil.rmtree(old, ignore_errors=True)
    env["NUMBA_CACHE_DIR"] = str(caches / digest.hexdigest())
    # 2. a fresh virtual environment (no pip in it: the project's pip installs into it)
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, cwd=base)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
          str(wheel)], env=env, cwd=base)
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        env=env, cwd=base).stdout.strip())
    # 3. the dependencies from the project's environment, without its editable diffgym
    deps = [p for p in site.getsitepackages() if os.path.isdir(p)]
    # (a .pth line is exec'd inside a function: the names are looked up with __import__)
    line = ("import sys; "
            f"[(__import__('sys').path.append(d), [__import__('site').addpackage(d, n, None) "
            f"for n in sorted(__import__('os').listdir(d)) "
            f"if n.endswith('.pth') and not n.startswith(('__editable__', 'distutils-precedence'))]) "
            f"for d in {deps!r}]\n")
    (purelib / "zz_project_deps.pth").write_text(line)
    # pip stamps the files with the time of installing; numba's cache is keyed on the source's
    # time stamp and size, so give them the wheel's (the sources') times: an unchanged wheel
    # reuses the kernels compiled by an earlier run, a changed one compiles them afresh (and
    # test_read_only_installation_and_home always compiles from scratch, without this cache)
    import time
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            f = purelib / info.filename
            if f.is_file():
                t = time.mktime(info.date_time + (0, 0, -1))
                os.utime(f, (t, t))
    work = base / "work"                         # the user's directory: not the checkout
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return dict(py=str(py), bin=venv / "bin", env=env, work=work, purelib=purelib, wheel=wheel)


def test_wheel_holds_every_module_and_data_file(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    expected = set()
    for src, dst in (("diffgym", "diffgym"), ("envs", "diffgym/envs"), ("assets", "diffgym/assets"),
                     ("configs", "diffgym/configs")):
        for p in (ROOT / src).rglob("*"):
            rel = p.relative_to(ROOT / src)
            if p.is_file() and "__pycache__" not in rel.parts and p.suffix not in (".pyc", ".nbi", ".nbc") \
                    and rel.parts[0] != "media":            # README images: not shipped
                expected.add(f"{dst}/{rel.as_posix()}")
    assert expected - names == set(), f"missing from the wheel: {sorted(expected - names)}"
    assert not any("/media/" in n for n in names)


def test_installed_copy_is_the_one_imported(installed):
    out = _run([installed["py"], "-c", "import diffgym, diffgym.envs, diffgym.train; "
                "print(diffgym.__file__); print(diffgym.envs.__file__); print(diffgym.train.__file__)"],
               env=installed["env"], cwd=installed["work"])
    for f in out.stdout.split():
        assert f.startswith(str(installed["purelib"])), (f, str(ROOT))


def test_make_every_id_after_import_diffgym_alone(installed):
    """(Every id is made and reset; the cart-pole and the hopper also step, with Jacobians through
    the wrappers: the other models' kernels are compiled by the rest of the suite.)"""
    code = textwrap.dedent(f"""
        import json, time
        import gymnasium as gym, numpy as np, diffgym
        times = {{}}
        for env_id in {IDS!r}:
            t = time.perf_counter()
            env = gym.make(env_id)
            assert env.spec.max_episode_steps == env.unwrapped.episode_steps > 0, env.spec
            env.reset(seed=0)
            if env_id in ("DiffCartPole-v0", "DiffHopper-v0"):
                a = np.zeros(env.action_space.shape)
                env.step(a)
                jac = env.get_wrapper_attr("step_with_jacobian")(a)[-1]
                assert np.all(np.isfinite(jac.state_state))
            times[env_id] = round(time.perf_counter() - t, 2)
            env.close()
        print(json.dumps(times))
    """)
    out = _run([installed["py"], "-c", code], env=installed["env"], cwd=installed["work"])
    times = json.loads(out.stdout.strip().splitlines()[-1])
    print("make + reset (+ first steps) in the fresh installation (s):", times)
    if "compiling the simulation kernels" in out.stderr:        # (not when the cache was warm)
        assert f"cached in {installed['env']['NUMBA_CACHE_DIR']}" in out.stderr, out.stderr
        assert re.search(r"diffgym: compiled \d+ kernels in \d+ s", out.stderr), out.stderr


def test_make_and_reset_say_nothing_on_a_cold_cache(installed, tmp_path):
    """`import diffgym` and gym.make + reset of every id on an empty kernel cache compile no
    kernel and write nothing to stderr (a compilation there, however small, can pass the
    announcer's one-second threshold on a loaded machine)."""
    code = ("import gymnasium as gym, diffgym\n"
            "from numba.core import event\n"
            "built = []\n"
            "class L(event.Listener):\n"
            "    def on_start(self, e): built.append(e.data['dispatcher'].py_func.__qualname__)\n"
            "    def on_end(self, e): pass\n"
            "event.register('numba:compile', L())\n"
            f"for i in {IDS!r}:\n"
            "    e = gym.make(i); e.reset(seed=0); e.close()\n"
            "print('compiled:', built)\n")
    env = dict(installed["env"], NUMBA_CACHE_DIR=str(tmp_path / "cold"))
    out = _run([installed["py"], "-c", code], env=env, cwd=installed["work"])
    assert out.stderr == "", out.stderr
    assert out.stdout.strip().splitlines()[-1] == "compiled: []", out.stdout


def test_readme_python_snippets(installed):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 2
    for k, code in enumerate(blocks):
        out = _run([installed["py"], "-c", code], env=installed["env"], cwd=installed["work"], check=False)
        assert out.returncode == 0, f"README python block {k + 1}:\n{code}\n--- stderr\n{out.stderr[-4000:]}"


def test_sb3_and_record_by_id(installed):
    code = ("import diffgym\nfrom stable_baselines3 import PPO\n"
            "m = PPO('MlpPolicy', 'DiffCartPole-v0', n_steps=16, batch_size=16, n_epochs=1)\n"
            "m.learn(16)\nprint(m.num_timesteps)\n")
    out = _run([installed["py"], "-c", code], env=installed["env"], cwd=installed["work"])
    assert int(out.stdout.split()[-1]) >= 16
    _run([str(installed["bin"] / "diffgym"), "record", "DiffHopper-v0", "x.gif", "--steps", "3",
          "--width", "64", "--height", "48"], env=installed["env"], cwd=installed["work"])
    assert (installed["work"] / "x.gif").stat().st_size > 0


def test_train_and_sweep_by_name(installed):
    env, work = installed["env"], installed["work"]
    _run([str(installed["bin"] / "diffgym"), "train", "cartpole_shac.yaml", "total_env_steps=64",
          "env.num_envs=2", "env.episode_steps=16", "shac.horizon=8", "shac.critic_minibatches=2",
          "eval_episodes=1", "gif=false", "--run-dir", "run"], env=env, cwd=work)
    assert (work / "run" / "eval.json").is_file() and (work / "run" / "checkpoint_last.pt").is_file()
    _run([str(installed["bin"] / "diffgym"), "sweep", "smoke.yaml", "--workers", "2", "--out", "sweep"],
         env=env, cwd=work)
    assert (work / "sweep" / "summary.csv").is_file()


def _as_unprivileged(cmd):
    """Run as an ordinary user (root ignores file permissions)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.fail("running as root without setpriv: cannot test a read-only installation")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] + list(cmd)


def test_read_only_installation_and_home(installed):
    """Read-only site-packages, HOME and XDG cache, no NUMBA_CACHE_DIR: kernels compiled in memory
    with one line saying so; a writable XDG_CACHE_HOME is used when there is one. Both compile
    the cart-pole's kernels from nothing: the first-use announcement and its duration."""
    purelib = installed["purelib"]
    shutil.rmtree(purelib / "diffgym" / "__pycache__", ignore_errors=True)     # (the kernel cache)
    home = installed["work"].parent / "home"
    home.mkdir()
    xdg = installed["work"].parent / "xdg"
    xdg.mkdir()
    env = dict(installed["env"], HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    del env["NUMBA_CACHE_DIR"]
    code = ("import gymnasium as gym, numpy as np, diffgym, diffgym.sim.jit as j\n"
            "e = gym.make('DiffCartPole-v0'); e.reset(seed=0); e.step(np.zeros(1))\n"
            "e.unwrapped.step_with_jacobian(np.zeros(1))\n"
            "print(j.CACHE_MODE, j.CACHE_DIR)\n")
    for p in (home, purelib):
        subprocess.run(["chmod", "-R", "a-w", str(p)], check=True)
    try:
        out = _run(_as_unprivileged([installed["py"], "-c", code]), env=env, cwd="/")
        assert out.stdout.split()[-2:] == ["memory", "None"], out.stdout
        assert out.stderr.count("compiling them in memory for this process only") == 1, out.stderr
        assert "diffgym: compiling the simulation kernels (first use only; in memory, not cached" \
            in out.stderr, out.stderr
        os.chmod(xdg, 0o777)
        env2 = dict(env, XDG_CACHE_HOME=str(xdg))          # a writable XDG cache: used
        out = _run(_as_unprivileged([str(installed["bin"] / "diffgym"), "compile", "DiffCartPole-v0"]),
                   env=env2, cwd="/")
        assert f"kernel cache: {xdg / 'diffgym' / 'numba'}" in out.stdout, out.stdout
        assert "DiffCartPole-v0: ready in" in out.stdout
        assert list((xdg / "diffgym" / "numba").rglob("*.nbi")), "nothing cached in XDG_CACHE_HOME"
        assert "in memory" not in out.stderr
        assert f"compiling the simulation kernels (first use only; cached in {xdg}" in out.stderr
        assert re.search(r"diffgym: compiled \d+ kernels in \d+ s \(later runs load them", out.stderr)
    finally:
        for p in (home, purelib):
            subprocess.run(["chmod", "-R", "u+w", str(p)], check=True)
