"""Check a GPU library's wheel built here before it is cached or carried to the GPU image.

    TOOLCHAIN/bin/python launchers/wheel_check.py WHEEL --name NAME --cuobjdump PATH
        --sass sm_90a [--sass ...] [--ptx sm_90 ...] [--hide-dist DIST ...] [--import MOD ...]
        [--commit SHA] [--out FINDINGS.json]

A wheel can look whole and still waste a lent GPU's minutes: built with a library's
``*_SKIP_CUDA_BUILD`` switch it holds Python only; built for another architecture its kernels
do not load; linked against a library the image lacks (``libpython3.12.so``) it does not import.
Each of these is checked here, on the CPU, in the build's toolchain (torch 2.11.0+cu130, the
image's): a compiled extension inside; the device code ``cuobjdump`` lists — every promised
SASS and PTX architecture present, and every shared object that carries device code carrying
one of them; every ``NEEDED`` library provided by torch's wheels (torch and the distributions it
requires), the wheel itself, glibc and the compiler's runtime, or the driver; and an import of
the library's modules (``tests/helpers/real_schemas.py``'s ``SPECS``, plus ``--import``) in a
fresh interpreter where the build-only distributions (``--hide-dist``) cannot be imported, whose
operator schemas and signatures must equal the committed record when it was read at the same
commit. Found besides, for the record: the other architectures, the torch C++ symbols the
extension calls (none: it keeps to the stable ABI and loads with a later torch; some: it loads
with this torch release alone, whatever its wheel tag says) and the newest glibc it needs.

Prints one line per check; writes the findings (``passed``, ``refused`` reasons) as JSON to
``--out``; exit status 0 when it passes, 1 when refused, 2 for bad arguments.
Standard library (and, in the import's interpreter, torch): it runs in the toolchain venv.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_LIBRARIES = frozenset(
    # glibc and the GCC runtime (manylinux's own list of what every Linux has), and the driver
    ("libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
     "libresolv.so.2", "ld-linux-x86-64.so.2", "libgcc_s.so.1", "libstdc++.so.6", "libcuda.so.1")
)  # fmt: skip
TORCH_CXX = re.compile(r"^_ZN?K?(3c10|2at|5torch)")
"""Mangled C++ names in torch's namespaces: calls into its unstable C++ ABI."""
DEVICE_CODE = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+[a-z]?)\.(cubin|ptx)$")


def shared_objects(site: Path) -> list[Path]:
    """Every shared object of the unpacked wheel (the extensions and what they bring)."""
    return sorted(p for p in site.rglob("*.so") if p.is_file())


def device_code(cuobjdump: str, so: Path) -> dict[str, list[str]]:
    """SASS and PTX architectures in one shared object (empty lists: host code only)."""
    done = subprocess.run(
        [cuobjdump, "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True
    )
    if done.returncode not in (0, 255):  # 255: "does not contain device code"
        raise RuntimeError(f"cuobjdump failed on {so.name}: {done.stderr.strip()}")
    found: dict[str, set[str]] = {"sass": set(), "ptx": set()}
    for line in done.stdout.splitlines():
        match = DEVICE_CODE.match(line.strip())
        if match:
            found["sass" if match[1] == "ELF" else "ptx"].add(match[2])
    return {kind: sorted(archs) for kind, archs in found.items()}


def readelf(option: str, so: Path) -> str:
    """One ELF section as readelf prints it (binutils is there wherever the build's gcc is)."""
    return subprocess.run(
        ["readelf", option, "-W", str(so)], capture_output=True, text=True, check=True
    ).stdout


def needed(so: Path) -> list[str]:
    """The libraries the loader must find for ``so`` (its ``DT_NEEDED`` entries)."""
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", so))


def undefined_symbols(so: Path) -> list[str]:
    """The dynamic symbols ``so`` takes from elsewhere (``name@version``)."""
    names = []
    for line in readelf("--dyn-syms", so).splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[6] == "UND":
            names.append(fields[7])
    return names


def torch_closure() -> set[str]:
    """The torch distribution and every one it requires (with their extras), as installed."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [("torch", frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in seen}


def libraries_of(distributions: set[str]) -> set[str]:
    """The file names of every shared library the distributions install."""
    names = set()
    for name in distributions:
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        names |= {Path(str(f)).name for f in files if re.search(r"\.so(\.|$)", str(f))}
    return names


def top_level_modules(distribution: str) -> list[str]:
    """The importable top-level names a distribution installs."""
    files = metadata.distribution(distribution).files or []
    tops = {str(f).split("/")[0].removesuffix(".py") for f in files}
    return sorted(t for t in tops if t.isidentifier())


IMPORT_DRIVER = """
import importlib.abc, json, sys
hidden, site, modules, name, root = json.loads(sys.argv[1])
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {fullname!r} (build-only: hidden)")
sys.meta_path.insert(0, Hide())
sys.path[:0] = [site, root]
import torch  # first, as the libraries' own Python does: it loads the libraries they need
for module in modules:
    importlib.import_module(module)
from tests.helpers import real_schemas
print(json.dumps(real_schemas.interface(name) if name in real_schemas.SPECS else None))
"""


def import_check(
    site: Path, name: str, extra: list[str], hidden: list[str]
) -> tuple[dict[str, Any] | None, str]:
    """(the interface read, "") after importing the library, or (None, why it failed)."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers import real_schemas

    spec = real_schemas.SPECS.get(name)
    modules = [*(spec.imports if spec else ()), *extra]
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", IMPORT_DRIVER,
         json.dumps([hidden, str(site), modules, name, str(ROOT)])],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        return None, " | ".join(done.stderr.strip().splitlines()[-3:])
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def schema_differences(name: str, found: dict[str, Any], commit: str) -> tuple[list[str], str]:
    """(differences from the committed record, a note) — compared only at the same commit."""
    from tests.helpers import real_schemas

    try:
        committed = real_schemas.load(name)
    except FileNotFoundError:
        return [], "no committed record"
    recorded_at = committed["provenance"]["commit"]
    if recorded_at != commit:
        return [], f"recorded at {recorded_at[:12]}, not this build's {commit[:12]}: not compared"
    differences = []
    for part in ("operators", "callables"):
        for key in sorted(set(committed[part]) | set(found[part])):
            if committed[part].get(key) != found[part].get(key):
                differences.append(f"{part[:-1]} {key}")
    return differences, f"equal to tests/unit/data/real_schemas/{name}.json"


def check(args: argparse.Namespace, site: Path) -> dict[str, Any]:
    """The findings on the wheel unpacked in ``site``; ``refused`` lists what fails."""
    refused: list[str] = []
    objects = shared_objects(site)
    rel = {so: str(so.relative_to(site)) for so in objects}
    findings: dict[str, Any] = {"extensions": [rel[so] for so in objects]}
    if not objects:
        refused.append("no compiled extension in the wheel (a *_SKIP_CUDA_BUILD build?)")

    code = {rel[so]: device_code(args.cuobjdump, so) for so in objects}
    carrying = {so: archs for so, archs in code.items() if archs["sass"] or archs["ptx"]}
    findings["device_code"] = carrying
    if objects and not carrying:
        refused.append("no device code in any extension")
    for kind, promised in (("sass", args.sass), ("ptx", args.ptx)):
        everywhere = {a for archs in carrying.values() for a in archs[kind]}
        refused += [f"no {arch} {kind.upper()} in the wheel" for arch in promised
                    if arch not in everywhere]  # fmt: skip
        findings[f"other_{kind}"] = sorted(everywhere - set(promised))
    for so, archs in carrying.items():
        if not (set(archs["sass"]) & set(args.sass) or set(archs["ptx"]) & set(args.ptx)):
            refused.append(f"{so} has device code for {archs} only, none promised")

    provided = libraries_of(torch_closure()) | SYSTEM_LIBRARIES | {so.name for so in objects}
    findings["needed"] = {rel[so]: needed(so) for so in objects}
    for so, libraries in findings["needed"].items():
        refused += [f"{so} needs {lib}, which neither torch's wheels nor the system provide"
                    for lib in libraries if lib not in provided]  # fmt: skip
    symbols = [s for so in objects for s in undefined_symbols(so)]
    cxx = sorted({s.split("@")[0] for s in symbols if TORCH_CXX.match(s)})
    findings["torch_abi"] = (
        f"torch {args.torch} only: calls {len(cxx)} C++ symbols of torch's unstable ABI"
        if cxx
        else "stable: no torch C++ symbols"
        + f" ({sum(s.startswith('aoti_torch_') for s in symbols)} aoti_torch_* calls)"
    )
    versions = re.findall(r"@GLIBC_([\d.]+)", "\n".join(symbols))
    glibc = [tuple(map(int, v.split("."))) for v in versions]
    findings["glibc"] = ".".join(map(str, max(glibc))) if glibc else None

    hidden = [m for dist in args.hide_dist for m in top_level_modules(dist)]
    interface, error = import_check(site, args.name, args.imports, hidden)
    findings["import"] = f"failed: {error}" if error else f"ok (hidden: {', '.join(hidden)})"
    if error:
        refused.append(f"import failed in the toolchain: {error}")
    elif interface is not None:
        differences, note = schema_differences(args.name, interface, args.commit)
        findings["schemas"] = f"differ: {', '.join(differences)}" if differences else note
        if differences:
            refused.append(f"its interface differs from the committed record: {differences}")
    findings["passed"], findings["refused"] = not refused, refused
    return findings


def main(argv: list[str]) -> int:
    """Check the wheel the arguments name; 0 passed, 1 refused (the reasons printed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--cuobjdump", required=True)
    parser.add_argument("--sass", action="append", default=[], required=True)
    parser.add_argument("--ptx", action="append", default=[])
    parser.add_argument("--hide-dist", action="append", default=[])
    parser.add_argument("--import", dest="imports", action="append", default=[])
    parser.add_argument("--commit", default="")
    parser.add_argument("--torch", default="2.11.0")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        parser.error(f"no wheel '{args.wheel}'")
    with tempfile.TemporaryDirectory(prefix="lcab-wheel-check-") as scratch:
        with zipfile.ZipFile(args.wheel) as wheel:
            wheel.extractall(scratch)
        findings = check(args, Path(scratch))
    for key, value in findings.items():
        if key not in ("passed", "refused"):
            print(f"wheel_check: {key}: {value}", file=sys.stderr)
    verdict = "passed" if findings["passed"] else "REFUSED: " + "; ".join(findings["refused"])
    print(f"wheel_check: {args.wheel.name}: {verdict}", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(findings, indent=1) + "\n")
    return 0 if findings["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
