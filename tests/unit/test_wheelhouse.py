"""launchers/wheelhouse.sh: wheels packed into parts that travel one per call, joined and
installed on the far side as they become whole (pip itself recorded, not run: the wheels here
are made-up bytes; what is checked is what reaches it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launchers" / "wheelhouse.sh"
MIB = 1024 * 1024


def wheelhouse(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, bytes]:
    """Made-up wheels: lcab's own requirement (small), one over a part, one mid-sized."""
    contents = {
        "hydra_core-1.3.8-py3-none-any.whl": os.urandom(20_000),
        "huge_pkg-1.0-py3-none-any.whl": os.urandom(5 * MIB // 2),  # 2.5 MiB: over a 2 MiB part
        "mid_pkg-1.0-py3-none-any.whl": os.urandom(3 * MIB // 2),
    }
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    return contents


@pytest.fixture
def fake_pip(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A python3 on PATH that records `-m pip` calls and runs everything else for real."""
    bin_dir, log = tmp_path / "bin", tmp_path / "pip.log"
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    shim.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$@" >> {log}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return env, log


def test_parts_fit_and_lcabs_requirements_travel_first(tmp_path, wheels):
    done = wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    assert done.returncode == 0, done.stderr
    parts = sorted((tmp_path / "house").glob("part-*"))
    assert len(parts) >= 2
    for part in parts:
        size = sum(f.stat().st_size for f in part.iterdir() if f.name != "manifest.txt")
        assert size <= 2 * MIB, (part, size)
        assert (part / "manifest.txt").is_file()  # every part can start an install
    assert (parts[0] / "hydra_core-1.3.8-py3-none-any.whl").is_file()
    pieces = sorted((tmp_path / "house").glob("part-*/huge_pkg-*.piece-*"), key=lambda p: p.name)
    assert (
        len(pieces) == 3
        and b"".join(p.read_bytes() for p in pieces) == wheels["huge_pkg-1.0-py3-none-any.whl"]
    )


def test_install_takes_what_is_whole_and_names_the_rest(tmp_path, wheels, fake_pip):
    env, log = fake_pip
    wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    stage, target = tmp_path / "stage", tmp_path / "site"
    parts = sorted((tmp_path / "house").glob("part-*"))
    assert wheelhouse("stage", str(parts[0]), str(stage)).returncode == 0
    first = wheelhouse("install", str(stage), str(target), env=env)
    assert first.returncode == 0, first.stderr
    installed = log.read_text()
    assert "hydra_core-1.3.8" in installed and "huge_pkg" not in installed
    assert "not yet staged" in first.stderr and "huge_pkg" in first.stderr
    for part in parts[1:]:
        wheelhouse("stage", str(part), str(stage))
    log.unlink()
    last = wheelhouse("install", str(stage), str(target), env=env)
    assert last.returncode == 0 and "not yet staged" not in last.stderr, last.stderr
    assert all(name in log.read_text() for name in wheels)
    for name, data in wheels.items():  # joined and intact
        assert hashlib.sha256((stage / name).read_bytes()).digest() == hashlib.sha256(data).digest()
    assert last.stdout.strip().startswith(f"export PYTHONPATH={target}")


def test_the_printed_path_runs_the_pth_files_of_the_target(tmp_path, wheels, fake_pip):
    env, _ = fake_pip
    wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    target = tmp_path / "site"
    (target / "pkg" / "inner").mkdir(parents=True)
    # what nvidia-cutlass-dsl's .pth does: code that puts a folder of its own on sys.path
    (target / "dsl.pth").write_text(
        f"import sys; sys.path.insert(0, {str(target / 'pkg' / 'inner')!r})\n"
    )
    stage = tmp_path / "stage"
    for part in sorted((tmp_path / "house").glob("part-*")):
        wheelhouse("stage", str(part), str(stage))
    done = wheelhouse("install", str(stage), str(target), env=env)
    assert done.stdout.strip() == f"export PYTHONPATH={target}:{target / 'pkg' / 'inner'}"


def test_a_damaged_piece_is_not_installed(tmp_path, wheels, fake_pip):
    env, log = fake_pip
    wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    stage = tmp_path / "stage"
    for part in sorted((tmp_path / "house").glob("part-*")):
        wheelhouse("stage", str(part), str(stage))
    piece = next(stage.glob("huge_pkg-*.piece-01"))
    piece.write_bytes(piece.read_bytes()[:-10])  # cut short, as a broken transfer leaves it
    done = wheelhouse("install", str(stage), str(tmp_path / "site"), env=env)
    assert done.returncode == 0 and "huge_pkg" in done.stderr
    assert "huge_pkg" not in log.read_text() and "mid_pkg" in log.read_text()


def test_bad_commands_say_what_is_valid():
    done = wheelhouse("bogus")
    assert done.returncode == 2 and "valid: make, pack, stage, install, build, built" in done.stderr
    assert wheelhouse("install", "/nonexistent").returncode == 2


def test_built_takes_the_newest_cached_wheel_of_each_kernel(tmp_path):
    """`make` carries what `build` cached: the newest build of each kernel, or says how to
    build one that is asked for and missing."""
    cache = tmp_path / "cache"
    for key, stamp, wheel in (("old", 1_000, "flash_attn_3-3.0.0-old.whl"),
                              ("new", 2_000, "flash_attn_3-3.0.0-new.whl")):  # fmt: skip
        folder = cache / "wheels" / "fa3" / key
        folder.mkdir(parents=True)
        (folder / wheel).write_bytes(b"wheel " + key.encode())
        (folder / "build.json").write_text('{"checks": {\n "passed": true\n}}')
        os.utime(folder / "build.json", (stamp, stamp))
    env = {**os.environ, "LCAB_CACHE": str(cache)}
    done = wheelhouse("built", str(tmp_path / "out"), env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["flash_attn_3-3.0.0-new.whl"]
    done = wheelhouse("built", str(tmp_path / "out2"), env={**env, "LCAB_WHEEL_BUILT": "fa3 ffa"})
    assert done.returncode == 2
    assert "no ffa wheel cached" in done.stderr and "wheelhouse.sh build ffa" in done.stderr
    facts = cache / "wheels" / "fa3" / "new" / "build.json"  # its checks refused it
    facts.write_text('{"checks": {\n "passed": false\n}}')
    done = wheelhouse("built", str(tmp_path / "out3"), env=env)
    assert done.returncode == 2 and "fails its checks, so it is not carried" in done.stderr


def test_every_part_installs_alone_on_a_fresh_machine(tmp_path, wheels, fake_pip):
    """A machine goes back after 30 s idle and its stage with it: each part, staged alone into
    an empty stage, installs lcab's own requirements and every whole wheel it holds."""
    env, log = fake_pip
    done = wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    assert done.returncode == 0, done.stderr
    parts = sorted((tmp_path / "house").glob("part-*"))
    assert len(parts) >= 2
    for part in parts:
        size = sum(f.stat().st_size for f in part.iterdir() if f.name != "manifest.txt")
        assert size <= 2 * MIB, (part, size)  # with lcab's requirements counted
        stage = tmp_path / f"stage-{part.name}"  # a fresh machine's
        assert wheelhouse("stage", str(part), str(stage)).returncode == 0
        log.write_text("")
        installed = wheelhouse("install", str(stage), str(tmp_path / "site"), env=env)
        assert installed.returncode == 0, installed.stderr
        whole = {f.name for f in part.glob("*.whl")}
        assert "hydra_core-1.3.8-py3-none-any.whl" in whole
        assert {name for name in wheels if name in log.read_text()} == whole


def test_the_house_is_refused_where_the_checkout_would_carry_it(tmp_path):
    """Untracked files travel with every device call: a house inside the checkout must be
    ignored, or the call goes over its 64 MiB and is refused."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    done = wheelhouse("make", str(repo / "house"))
    assert done.returncode == 2 and "inside the checkout and not git-ignored" in done.stderr
    assert not (repo / "house").exists()
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".whl/part-1"])
    assert ignored.returncode == 0  # the folder the guide names is ignored here


def test_gpu_check_on_a_staged_wheelhouse_uses_the_images_python_and_no_index(
    tmp_path, wheels, fake_pip
):
    """On a lent GPU machine (no index, no .venv: it never travels) a staged wheelhouse makes
    gpu_check.sh take python3 and install nothing but the wheelhouse, with --no-index: a pip
    call that waits on an index would spend the GPU's minutes."""
    env, log = fake_pip
    checkout = tmp_path / "checkout"  # no .venv, no setup.sh: any other road fails loudly
    (checkout / "launchers").mkdir(parents=True)
    for script in ("gpu_check.sh", "wheelhouse.sh"):
        shutil.copy(ROOT / "launchers" / script, checkout / "launchers")
    shim = Path(env["PATH"].split(":")[0]) / "python3"
    shim.write_text(  # torch sees a GPU; pip is recorded; the rest runs for real
        shim.read_text().replace(
            "#!/bin/sh\n", '#!/bin/sh\ncase "$*" in *torch.cuda.is_available*) exit 0 ;; esac\n'
        )
    )
    wheelhouse("pack", str(tmp_path / "wheels"), str(tmp_path / "house"), "2")
    stage = tmp_path / "stage"
    wheelhouse("stage", str(tmp_path / "house" / "part-1"), str(stage))
    env = {**env, "LCAB_WHEELHOUSE_STAGE": str(stage), "LCAB_GPU_STEPS": "none"}
    done = subprocess.run(
        ["bash", str(checkout / "launchers" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a wheelhouse is staged" in done.stdout and "python3, extras ''" in done.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and "--no-index" in calls[0] and "hydra_core" in calls[0]
